"""Which task each pool record gets, when training data carries no task labels.

Precedence, per record: its own task field > a ``--task SOURCE=TASK`` mapping (SOURCE: a pool
file, a glob, a folder, or a LLaMA-Factory dataset name; the first mapping that matches wins) >
the taxonomy's ``match`` rules (in file order, the first that matches wins) > ``--default-task``
(per modality: a default task takes only records of a modality its taxonomy entry lists). A
record left without a task is counted per source; :meth:`TaskAssigner.unassigned_error` then
names, per source, the flag that would assign it.

The pool reader calls :meth:`TaskAssigner.assign` once per record of pools of millions: the field
and mapping paths are a dict lookup, a mapping is resolved once per source, and the rules are
filtered once per combination of media kinds. An assigner counts as it goes (for the report), so
it is meant for one reading thread.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from quantkit.errors import InputError
from quantkit.taxonomy import MEDIA_KINDS, MatchRule, Taxonomy, is_valid_modality, task_lookup

ORIGINS = ("field", "mapping", "rule", "default")
EXAMPLE_CHARS = 120  # an example prompt in the summary is cut to about this
_SUMMARY_SOURCES = 100  # the unassigned sources the summary lists (the largest first)
_ERROR_SOURCES = 20  # ... and the error message
_USER_TEXTS_KEPT = 2048  # user texts whose searches are kept, for prompts that repeat


@dataclass(frozen=True, slots=True)
class TaskEvidence:
    source: str  # the pool file as the user named it (str of the Path), glob-matchable
    dataset: str | None  # LLaMA-Factory dataset name when read through dataset_info.json, else None
    record_task: str | None  # the record's own task field, raw spelling, None when absent/empty
    user_text: str  # text of the user turns (the request: no system text, no tool definitions), "\n"-joined
    answer_text: str  # text of the assistant turns, joined with "\n"
    media_kinds: frozenset[str]  # subset of {"image", "video", "audio"} the record carries
    # The record's modality name (quantkit.pool.sizes.modality_name: multi-image, a video's sound);
    # None: the media kinds' (one item each, videos silent).
    modality: str | None = None

    @property
    def modality_name(self) -> str:
        if self.modality is not None:
            return self.modality
        return "+".join(kind for kind in MEDIA_KINDS if kind in self.media_kinds) or "text"


@dataclass(frozen=True, slots=True)
class TaskAssignment:
    task: str | None  # canonical taxonomy task name; None = no task could be assigned
    origin: str  # "field" | "mapping" | "rule" | "default" | "none"
    # field: raw value; mapping: the SOURCE pattern; rule: "<task>.match[<i>]"; default: the modality
    detail: str


class UnknownTaskError(ValueError):
    """A record's task field names no taxonomy task; the message gives the close matches."""


_NONE = TaskAssignment(None, "none", "")


def example_prompt(text: str) -> str:
    """``text`` on one line, cut to about EXAMPLE_CHARS (its start and its end kept)."""
    flat = " ".join(text.split())
    if len(flat) <= EXAMPLE_CHARS:
        return flat
    return flat[: EXAMPLE_CHARS * 3 // 5].rstrip() + " … " + flat[-(EXAMPLE_CHARS * 2 // 5) :].lstrip()


def _flag(value: str) -> str:
    """``value`` quoted for a POSIX shell, always in quotes (SOURCE may be a glob)."""
    quoted = shlex.quote(value)
    return quoted if quoted.startswith("'") else f"'{value}'"


def source_matches(pattern: str, source: str, dataset: str | None) -> bool:
    """Whether ``--task PATTERN=...`` names a record read from ``source`` (as the user named it)
    under LLaMA-Factory dataset ``dataset``: the dataset name (or a glob of it), the file (however
    spelled: relative, absolute, ``./``), a glob of its path (of its file name when the glob has no
    ``/``), or a folder above it."""
    if dataset is not None and fnmatch.fnmatchcase(dataset, pattern):
        return True
    if not source:
        return False
    path_forms = {source, os.path.normpath(source), os.path.abspath(source)}
    pattern_forms = {pattern, os.path.normpath(pattern), os.path.abspath(os.path.expanduser(pattern))}
    if any(fnmatch.fnmatchcase(name, form) for name in path_forms for form in pattern_forms):
        return True
    if "/" not in pattern and fnmatch.fnmatchcase(os.path.basename(source), pattern):
        return True
    folder = os.path.abspath(os.path.expanduser(pattern)).rstrip(os.sep) + os.sep
    return os.path.abspath(source).startswith(folder)


class TaskAssigner:
    """Gives each record its task (see the module) and keeps the counts the report shows."""

    def __init__(
        self,
        taxonomy: Taxonomy,
        mappings: Sequence[str] = (),
        default_task: str | Sequence[str] | None = None,
    ) -> None:
        """mappings are the CLI's `--task SOURCE=TASK` strings (SOURCE: a pool file, a glob, or a
        LLaMA-Factory dataset name); default_task the `--default-task` values, each MODALITY=TASK or
        TASK (for every modality the task lists). Raises quantkit.errors.InputError (exit 2) for a
        malformed mapping, an unknown task (with the close matches), a default that names an unknown
        modality, one the task does not list, or two tasks for one modality."""
        self.taxonomy = taxonomy
        names = task_lookup(taxonomy)
        # Every assignment the assigner can give is made once; counts are kept per slot (index).
        self._slots: list[TaskAssignment] = []
        self._counts: list[int] = []
        self._field: dict[str, int] = {
            raw: self._slot(task.name, "field", raw) for raw, task in names.items()
        }
        # Records whose own field names a task, by that name, counted by the reader itself (see
        # field_tally); folded into the counts when they are read. One for the assigner (it is
        # single-threaded), so summary() costs the same after 10k sources as after one.
        self._tally: dict[str, int] = dict.fromkeys(self._field, 0)
        self.tallies_folded = 0  # tallies walked by the last fold (one): tests check it stays so

        self._mappings: list[tuple[str, int]] = []  # (SOURCE pattern, slot), in the order given
        seen: dict[str, str] = {}
        for text in mappings:
            source, sep, task_name = text.rpartition("=")
            source, task_name = source.strip(), task_name.strip()
            if not sep or not source or not task_name:
                raise InputError(
                    f"--task {_flag(text)}: expected SOURCE=TASK",
                    hint="SOURCE is a pool file, a glob or a LLaMA-Factory dataset name, TASK a taxonomy task, "
                    "e.g. --task 'data/receipts_*.jsonl=ocr' or --task 'mllm_demo=short_caption'",
                )
            task = names.get(task_name)
            if task is None:
                raise InputError(
                    f"--task {_flag(text)}: unknown task {task_name!r}; {taxonomy.suggest(task_name)}"
                )
            if source in seen and seen[source] != task.name:
                raise InputError(
                    f"--task {_flag(text)}: SOURCE {source!r} is already mapped to {seen[source]!r}",
                    hint="give each SOURCE one task; the first mapping that matches a record wins",
                )
            seen[source] = task.name
            self._mappings.append((source, self._slot(task.name, "mapping", source)))
        self._by_source: dict[tuple[str, str | None], int | None] = {}

        self._rules: list[tuple[int, MatchRule]] = []  # (slot, rule), in file order
        for task in taxonomy.tasks:
            for i, rule in enumerate(task.match):
                self._rules.append((self._slot(task.name, "rule", f"{task.name}.match[{i}]"), rule))
        self._rule_info = {slot: rule for slot, rule in self._rules}
        self._by_kinds: dict[frozenset[str], tuple] = {}
        self._examples: dict[int, list[str]] = {slot: [] for slot, _ in self._rules}
        self._user_found: dict[str, dict] = {}

        # modality -> the slot of its default task; (flag as given, modality, slot) for the report
        self._defaults: dict[str, int] = {}
        self._default_rows: list[tuple[str, str, int]] = []
        self._parse_defaults(default_task, names)
        # (source, dataset) -> [records without a task, modalities seen, an example prompt]
        self._missing: dict[tuple[str, str | None], list] = {}

    def _parse_defaults(self, values: str | Sequence[str] | None, names: dict) -> None:
        """``--default-task`` values: MODALITY=TASK, or TASK for each modality the task lists (an
        explicit MODALITY=TASK wins over it)."""
        if values is None:
            return
        values = [values] if isinstance(values, str) else list(values)
        modality_names = sorted({m for task in self.taxonomy.tasks for m in task.modalities})
        claims: dict[str, tuple[str, str, bool]] = {}  # modality -> (task, flag, explicit)
        for text in values:
            modality, sep, task_name = text.rpartition("=")
            modality, task_name = modality.strip(), task_name.strip()
            if sep and not modality:
                raise InputError(f"--default-task {_flag(text)}: expected MODALITY=TASK or TASK")
            task = names.get(task_name)
            if task is None:
                raise InputError(
                    f"--default-task {_flag(text)}: unknown task {task_name!r}; {self.taxonomy.suggest(task_name)}"
                    if sep
                    else f"--default-task {_flag(text)}: unknown task; {self.taxonomy.suggest(task_name)}"
                )
            if sep and not is_valid_modality(modality):
                raise InputError(
                    f"--default-task {_flag(text)}: unknown modality {modality!r}",
                    hint=f"modalities the taxonomy lists: {', '.join(modality_names)}",
                )
            if sep and modality not in task.modalities:
                raise InputError(
                    f"--default-task {_flag(text)}: task {task.name!r} takes {', '.join(task.modalities)} "
                    f"records, not {modality}",
                    hint=f"tasks for {modality} records: {', '.join(self._tasks_of(modality)) or 'none'}",
                )
            for each in [modality] if sep else task.modalities:
                held = claims.get(each)
                if held is not None and held[0] != task.name and held[2] == bool(sep):
                    raise InputError(
                        f"--default-task {_flag(text)}: {each} records already go to {held[0]!r} "
                        f"(--default-task {_flag(held[1])})",
                        hint=f"give one task per modality: --default-task '{each}=TASK'",
                    )
                if held is None or (sep and not held[2]):
                    claims[each] = (task.name, text, bool(sep))
        for modality, (task_name, text, _) in claims.items():
            slot = self._slot(task_name, "default", modality)
            self._defaults[modality] = slot
            self._default_rows.append((text, modality, slot))

    def _tasks_of(self, modality: str) -> list[str]:
        return [task.name for task in self.taxonomy.tasks if modality in task.modalities]

    def _slot(self, task: str, origin: str, detail: str) -> int:
        self._slots.append(TaskAssignment(task, origin, detail))
        self._counts.append(0)
        return len(self._slots) - 1

    # -- per record ----------------------------------------------------------------------------

    def assign(self, evidence: TaskEvidence) -> TaskAssignment:
        """Precedence: record field > --task mapping > taxonomy match rules (in order, first match wins)
        > --default-task. Raises UnknownTaskError for a field naming no task (the reader turns it into an
        invalid record with file and line). Cheap: called for every record of 10M-record pools."""
        raw = evidence.record_task
        if raw:
            slot = self._field.get(raw)
            if slot is None:
                raise UnknownTaskError(f"unknown task {raw!r}; {self.taxonomy.suggest(raw)}")
        else:
            slot = None
            if self._mappings:
                key = (evidence.source, evidence.dataset)
                slot = self._by_source.get(key, -1)
                if slot == -1:
                    slot = self._by_source[key] = self._mapping_of(*key)
            if slot is None:
                slot = self._rule_of(evidence)
                if slot is None:
                    slot = self._defaults.get(evidence.modality_name) if self._defaults else None
                    if slot is None:
                        self._note_missing(evidence)
                        return _NONE
        self._counts[slot] += 1
        return self._slots[slot]

    def field_tally(self) -> dict[str, int]:
        """A tally (field value -> records) for a reader to count, in place of assign(), the records
        whose task field names a task: what assign() gives them is fixed (the field's task, origin
        "field"), and counting costs a tenth of the call on a 10M-record pool. summary() counts it.
        The same tally every call: readers of every source count into it."""
        return self._tally

    def _fold_tallies(self) -> None:
        tally = self._tally
        for raw, count in tally.items():
            if count:
                self._counts[self._field[raw]] += count
                tally[raw] = 0
        self.tallies_folded = 1

    def _mapping_of(self, source: str, dataset: str | None) -> int | None:
        for pattern, slot in self._mappings:
            if source_matches(pattern, source, dataset):
                return slot
        return None

    def _rule_of(self, evidence: TaskEvidence) -> int | None:
        kinds = evidence.media_kinds
        candidates = self._by_kinds.get(kinds)
        if candidates is None:
            candidates = self._by_kinds[kinds] = tuple(
                (slot, rule.conditions) for slot, rule in self._rules if rule.fits_media(kinds)
            )
        user, answer = evidence.user_text, evidence.answer_text
        # What each pattern list gives on a text is searched once per record (lists are shared by
        # rules) and, for the user text, kept for the records that repeat it (templated prompts).
        on_user = self._user_found.get(user)
        if on_user is None:
            if len(self._user_found) >= _USER_TEXTS_KEPT:
                self._user_found.clear()
            on_user = self._user_found[user] = {}
        found, texts, lowered = (on_user, {}), (user, answer), [None, None]
        for slot, conditions in candidates:
            for patterns, on_answer, negate in conditions:
                hit = found[on_answer].get(patterns)
                if hit is None:
                    text = texts[on_answer]
                    low = lowered[on_answer]
                    if low is None:
                        low = lowered[on_answer] = text.lower()
                    hit = found[on_answer][patterns] = patterns.found(low, text)
                if hit is negate:
                    break
            else:
                examples = self._examples[slot]
                if len(examples) < 2:
                    example = example_prompt(user)
                    if example not in examples:
                        examples.append(example)
                return slot
        return None

    def _note_missing(self, evidence: TaskEvidence) -> None:
        key = (evidence.source, evidence.dataset)
        entry = self._missing.get(key)
        if entry is None:
            entry = self._missing[key] = [0, set(), example_prompt(evidence.user_text)]
        entry[0] += 1
        entry[1].add(evidence.modality_name)

    # -- a pool read in parts (quantkit.pool.split) --------------------------------------------

    def start_part(self) -> None:
        """In a process reading part of a source: forget the counts so far, so that
        :meth:`part_state` holds what this part adds (the reader keeps the tally's identity)."""
        self._counts[:] = [0] * len(self._counts)
        for raw in self._tally:
            self._tally[raw] = 0
        self._examples = {slot: [] for slot in self._examples}
        self._missing = {}

    def part_state(self) -> dict:
        return {"counts": self._counts, "tally": self._tally, "examples": self._examples, "missing": self._missing}

    def merge_part(self, state: dict) -> None:
        """Add a later part's :meth:`part_state`: counts as if this assigner had read it."""
        for slot, count in enumerate(state["counts"]):
            self._counts[slot] += count
        for raw, count in state["tally"].items():
            self._tally[raw] += count
        for slot, found in state["examples"].items():  # the first two distinct, in record order
            examples = self._examples[slot]
            for example in found:
                if len(examples) < 2 and example not in examples:
                    examples.append(example)
        for key, (count, kinds, example) in state["missing"].items():
            entry = self._missing.get(key)
            if entry is None:
                self._missing[key] = [count, set(kinds), example]
            else:
                entry[0] += count
                entry[1].update(kinds)

    # -- afterwards ----------------------------------------------------------------------------

    def _fitting_tasks(self, modalities_seen: set[str]) -> list[str]:
        """The tasks that list every modality in ``modalities_seen``."""
        fitting = [
            task.name for task in self.taxonomy.tasks if all(m in task.modalities for m in modalities_seen)
        ]
        return fitting or [task.name for task in self.taxonomy.tasks]

    def _missing_sources(self) -> list[tuple[tuple[str, str | None], list]]:
        return sorted(self._missing.items(), key=lambda item: (-item[1][0], item[0][0], item[0][1] or ""))

    def summary(self) -> dict:
        """JSON-able, bounded in size: per task, counts by origin; per rule, its count and up to two
        example user prompts (truncated to ~120 chars); per source, how many records got no task."""
        self._fold_tallies()
        by_task: dict[str, dict[str, int]] = {}
        for assignment, count in zip(self._slots, self._counts, strict=True):
            if count:
                row = by_task.setdefault(assignment.task, dict.fromkeys(ORIGINS, 0))
                row[assignment.origin] += count
        tasks = {task.name: by_task[task.name] for task in self.taxonomy.tasks if task.name in by_task}
        for row in tasks.values():
            row["total"] = sum(row[origin] for origin in ORIGINS)
        missing = self._missing_sources()
        unassigned = sum(entry[0] for _, entry in missing)
        return {
            "records": sum(self._counts) + unassigned,
            "precedence": "record field > --task mapping > taxonomy match rules (first match) > --default-task",
            "tasks": tasks,
            "mappings": [
                {"source": pattern, "task": self._slots[slot].task, "count": self._counts[slot]}
                for pattern, slot in self._mappings
            ],
            "rules": [
                {
                    "rule": self._slots[slot].detail,
                    "task": self._slots[slot].task,
                    "description": rule.description,
                    "conditions": rule.summary(),
                    "count": self._counts[slot],
                    "examples": list(self._examples[slot]),
                }
                for slot, rule in self._rules
            ],
            "default_tasks": [
                {"flag": flag, "modality": modality, "task": self._slots[slot].task, "count": count}
                for flag, modality, slot in self._default_rows
                for count in [self._counts[slot]]
            ],
            "unassigned": {
                "count": unassigned,
                "by_source": [
                    {"source": source, "dataset": dataset, "count": entry[0], "example": entry[2]}
                    for (source, dataset), entry in missing[:_SUMMARY_SOURCES]
                ],
                "sources_left_out": max(0, len(missing) - _SUMMARY_SOURCES),
            },
        }

    def unassigned_error(self) -> InputError | None:
        """None when every record got a task; else an InputError listing, per source, how many records
        have no task and the exact flags that would assign them (`--task 'SOURCE=TASK'`, `--default-task TASK`)."""
        if not self._missing:
            return None
        missing = self._missing_sources()
        total = sum(entry[0] for _, entry in missing)
        lines = [
            f"{total} record(s) have no task: no task field, no --task mapping, no taxonomy match rule "
            "and no --default-task for them"
        ]
        for (source, dataset), (count, modalities_seen, example) in missing[:_ERROR_SOURCES]:
            fitting = self._fitting_tasks(modalities_seen)
            task = fitting[0] if len(fitting) == 1 else "TASK"
            media = " / ".join(sorted(modalities_seen))
            where = f"dataset {dataset} ({source})" if dataset else source
            line = f"  {where}: {count} record(s) ({media}), e.g. {example!r}: --task {_flag(f'{dataset or source}={task}')}"
            if task == "TASK":
                line += f" with TASK one of {', '.join(fitting)}"
            lines.append(line)
        if len(missing) > _ERROR_SOURCES:
            lines.append(f"  ... and {len(missing) - _ERROR_SOURCES} more source(s)")
        left = sorted({m for _, entry in missing for m in entry[1]})
        lines.append("or, per modality, a default task for the records left:")
        for modality in left:
            tasks = self._tasks_of(modality)
            task = tasks[0] if len(tasks) == 1 else "TASK"
            line = f"  {modality}: --default-task {_flag(f'{modality}={task}')}"
            if task == "TASK":
                line += f" with TASK one of {', '.join(tasks)}" if tasks else " (no task lists it)"
            lines.append(line)
        return InputError(
            "\n".join(lines),
            hint="name the task of a file, glob or dataset with --task 'SOURCE=TASK', give the records left "
            "of a modality one task with --default-task 'MODALITY=TASK' (a task takes only the modalities "
            "its taxonomy entry lists), or add a `match` rule to the taxonomy",
        )
