"""Mixed precision: which layers keep 8 bits within an average-bits budget, the group size, the
config groups (:mod:`.mixed`), from a ranking of layers (:mod:`.table`, written by
``quantkit sensitivity``); nothing here imports the stage that measures the ranking."""
