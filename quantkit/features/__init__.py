"""What the model is calibrated on: processor outputs per sample (:mod:`.processor`) and the
language-model decoder's captured inputs (:mod:`.capture`), both cached on disk."""
