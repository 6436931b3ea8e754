"""vLLM's flag tables, one per release (`flags/<version>.txt`, dumped from `vllm serve`'s
parser by `scripts/dump-vllm-flags.py`), read as every engine's are (`engine.flag_tables`);
and, curated from vLLM's source, what to use instead of a flag a release removed.

Pure: plain data read from the package's own files.
"""

from __future__ import annotations

from slotune.engine.flag_tables import FlagTables

# The version of the default image's table, used for an image whose tag names no version.
PINNED_VERSION = "0.32.0"

TABLES = FlagTables(package="slotune.engine.vllm", engine="vLLM", pinned=PINNED_VERSION)

# The tables' questions, by the names vLLM's rules, tests and benchmarks ask them by.
supported_versions = TABLES.supported_versions
flag_arity = TABLES.flag_arity
flag_values = TABLES.flag_values
known_flags = TABLES.known_flags
exact_table = TABLES.exact_table
version_of_image = TABLES.version_of_image
flag_table_note = TABLES.flag_table_note
removed_flag = TABLES.removed_flag
added_in = TABLES.added_in

_KV_SCALES = "remove it; vLLM loads the k and v scales from the checkpoint, else uses 1.0"

# What to use instead of a flag a newer table lacks, where vLLM's source says; a flag the
# tables show removed without an entry here is reported without one.
_PREFILL_CAP = "use spec.engine.args.longPrefillTokenThreshold (--long-prefill-token-threshold)"

REPLACEMENTS: dict[str, str] = {
    # 0.24.0's V1 scheduler reads only long_prefill_token_threshold; the two partial-prefill
    # limits were checked in SchedulerConfig and enforced nowhere.
    "--max-num-partial-prefills": _PREFILL_CAP,
    "--max-long-partial-prefills": _PREFILL_CAP,
    # 0.24.0 (config/cache.py): deprecated; "the scales will be loaded from the model
    # checkpoint if available, otherwise they default to 1.0". 0.31.0 has no such option.
    "--calculate-kv-scales": _KV_SCALES,
    "--no-calculate-kv-scales": _KV_SCALES,
}
