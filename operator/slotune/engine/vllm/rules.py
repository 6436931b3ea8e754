"""What slotune knows of vLLM: the tuned flags, their validity rules, and argument rendering.

Everything here is plain data and pure functions, so the rules can be tested without an
engine and checked *before* a configuration is launched (a crash is the expensive way to learn
that `--block-size 8` is invalid on FlashAttention). Facts come from vLLM's own source for the
pinned version; the flags each release's `vllm serve` parser accepts are dumped from that
parser into `flags/<version>.txt` and read by `tables`, which also says what a release removed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slotune.engine import extra_args as checks
from slotune.engine.base import Violation
from slotune.engine.knobs import Choices, FloatSpan, IntSpan, Knob, render_knobs
from slotune.engine.vllm import tables
from slotune.engine.vllm.tables import PINNED_VERSION, flag_arity, known_flags
from slotune.models import (
    KV_CACHE_DTYPE_NAMES,
    LOSSY_KV_CACHE_DTYPES,
    ONLINE_QUANTIZATION,
    AttentionBackend,
    EngineArgs,
    SpeculativeConfig,
)

DEFAULT_PORT = 8000


# Every setting slotune sets from a typed field of spec.engine.args, in the order it renders
# them (a new order would change every Deployment's pod template, and restart every engine, on
# upgrade). `search` is the default search range per platform, `defaults` vLLM's resolved
# defaults for `vllm serve` there (reference/vllm.md §1.1a, §4): on the CPU engine the KV
# cache is sized by VLLM_CPU_KVCACHE_SPACE, so the memory fraction is not tuned there, and
# block sizes and KV dtypes are kept where the platform's attention backend accepts them.
KNOBS: tuple[Knob, ...] = (
    Knob(
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
        "maxNumBatchedTokens",
        short="batched",
        search={"cpu": IntSpan(128, 8192, log=True), "h200": IntSpan(256, 32768, log=True)},
        defaults={"cpu": 2048, "h200": 8192},
    ),
    Knob(
        "block_size",
        "--block-size",
        "blockSize",
        short="block",
        search={
            "cpu": Choices((16, 32, 64, 128, 256)),
            "h200": Choices((16, 32, 64, 128, 256)),
        },
        defaults={"cpu": 128, "h200": 16},
    ),
    Knob(
        "gpu_memory_utilization",
        "--gpu-memory-utilization",
        "gpuMemoryUtilization",
        short="gmu",
        aliases=("--device-memory-utilization",),
        search={"h200": FloatSpan(0.80, 0.95, step=0.01)},
        defaults={"h200": 0.92},
    ),
    Knob(
        "max_num_seqs",
        "--max-num-seqs",
        "maxNumSeqs",
        short="seqs",
        search={"cpu": IntSpan(8, 256, log=True), "h200": IntSpan(8, 1024, log=True)},
        defaults={"cpu": 128, "h200": 1024},
    ),
    Knob("max_model_len", "--max-model-len", "maxModelLen", short="len"),
    Knob(
        "enable_prefix_caching",
        "--enable-prefix-caching",
        "enablePrefixCaching",
        short="prefix",
        aliases=("--disable-prefix-caching",),
        negative="--no-enable-prefix-caching",
        search={"cpu": Choices((True, False)), "h200": Choices((True, False))},
        defaults={"cpu": True, "h200": True},
    ),
    Knob(
        "kv_cache_dtype",
        "--kv-cache-dtype",
        "kvCacheDtype",
        short="kv",
        search={"h200": Choices(("auto", "fp8"))},
        # Defaults everywhere: vLLM's defaults are a study's first trial and the quality gate's
        # reference, lossless even where the spec's searchSpace names lossy values.
        defaults={"cpu": "auto", "h200": "auto"},
        lossy=lambda dtype: dtype in LOSSY_KV_CACHE_DTYPES,
    ),
    Knob(
        "quantization",
        "--quantization",
        "quantization",
        short="quant",
        aliases=("-q",),
        search={"h200": Choices(("none", "fp8"))},
        defaults={"cpu": "none", "h200": "none"},
        lossy=lambda method: method in ONLINE_QUANTIZATION,
        off="none",
    ),
    Knob(
        "long_prefill_token_threshold",
        "--long-prefill-token-threshold",
        "longPrefillTokenThreshold",
        short="lpt",
    ),
    Knob(
        "speculative",
        "--speculative-config",
        "speculative",
        short="spec",
        aliases=("-sc",),
        value_text=lambda config: SpeculativeConfig.model_validate(config).flag_value(),
    ),
)


# vLLM reads its API key (required on /v1 paths) from this variable; slotune's load generator
# sends what it holds.
API_KEY_VAR = "VLLM_API_KEY"

# Flags the operator itself owns: they wire the engine to the pod, the Service and Prometheus.
MANAGED_FLAGS: dict[str, str] = {
    "--model": "set spec.model.name",
    "--served-model-name": "set spec.model.servedName",
    "--host": "the operator binds the engine to all addresses",
    "--port": f"the operator serves on port {DEFAULT_PORT}, named http",
    "--uds": "the operator serves over TCP so the Service and probes reach the engine",
    "--disable-log-stats": "it switches off every vllm:* metric slotune measures the SLO with",
    "--tensor-parallel-size": "set spec.resources.gpus",
    "-tp": "set spec.resources.gpus",
    "--load-format": "set spec.model.source",
    "--download-dir": "set spec.model.source",
    "--api-key": "a key in a spec is readable by anyone who can read the LLMDeployment; put it "
    "in a Secret and name it in spec.engine.apiKeySecretRef",
}

# Flags that appear in tuning articles or older releases but that this vLLM does not accept
# (its parser exits with "unrecognized arguments"), each with the real equivalent.
NONEXISTENT_FLAGS: dict[str, str] = {
    "--chunked-prefill-size": "that is SGLang's flag; in vLLM the chunked-prefill budget is "
    "--max-num-batched-tokens (spec.engine.args.maxNumBatchedTokens), the per-request cap "
    "spec.engine.args.longPrefillTokenThreshold",
    "--swap-space": "removed from vLLM (V1 preempts by recompute, never swaps); for KV-cache "
    "offload to CPU use --kv-offloading-size",
    "--tokenizer-pool-size": "removed from vLLM with the V0 tokenizer pool; use "
    "--renderer-num-workers or --api-server-count",
    "--tokenizer-pool-type": "removed from vLLM with the V0 tokenizer pool; use "
    "--renderer-num-workers or --api-server-count",
    "--tokenizer-pool-extra-config": "removed from vLLM with the V0 tokenizer pool; use "
    "--renderer-num-workers or --api-server-count",
    "--tokenizer-cache-size": "vLLM has no tokenizer cache; prefix caching "
    "(spec.engine.args.enablePrefixCaching) caches KV blocks",
    "--tokenizer-cache-ttl": "vLLM has no tokenizer cache; prefix caching "
    "(spec.engine.args.enablePrefixCaching) caches KV blocks",
    "--max-paddings": "removed in early vLLM; CUDA-graph padding follows "
    "--cudagraph-capture-sizes / --max-cudagraph-capture-size",
    "--max-num-partial-prefills": "removed from vLLM (the V1 scheduler never enforced it); "
    "use spec.engine.args.longPrefillTokenThreshold",
    "--max-long-partial-prefills": "removed from vLLM (the V1 scheduler never enforced it); "
    "use spec.engine.args.longPrefillTokenThreshold",
    "--profile": "not a vLLM serve flag (vLLM would read it as --profiler-config); use "
    "--profiler-config",
    "--moe-enable-expert-parallelism": "use --enable-expert-parallel",
    "--moe-expert-parallel-size": "vLLM derives the expert-parallel size from TP x DP; "
    "use --enable-expert-parallel",
    "--moe-num-experts-per-token": "top-k is a property of the model; use --hf-overrides",
    "--moe-router-type": "routing is defined by the model; see --moe-backend",
    "--moe-enable-expert-caching": "vLLM has no expert cache; see --cpu-offload-gb",
    "--moe-expert-cache-size": "vLLM has no expert cache; see --cpu-offload-gb",
    "--moe-cache-type": "vLLM has no expert cache; see --cpu-offload-gb",
}


@dataclass(frozen=True)
class BlockSizeRule:
    """Block sizes an attention backend's kernels accept."""

    multiple_of: int | None = None
    one_of: tuple[int, ...] = ()

    def accepts(self, size: int) -> bool:
        if self.multiple_of is not None:
            return size % self.multiple_of == 0
        return size in self.one_of

    def describe(self) -> str:
        if self.multiple_of is not None:
            return f"a multiple of {self.multiple_of}"
        return "one of " + ", ".join(str(s) for s in self.one_of)


BLOCK_SIZE_RULES: dict[str, BlockSizeRule] = {
    "FLASH_ATTN": BlockSizeRule(multiple_of=16),
    "TRITON_ATTN": BlockSizeRule(multiple_of=16),
    "FLEX_ATTENTION": BlockSizeRule(multiple_of=16),
    "FLASHINFER": BlockSizeRule(one_of=(16, 32, 64)),
    "CPU_ATTN": BlockSizeRule(multiple_of=32),
}

_BASE_KV_DTYPES = ("auto", "float16", "bfloat16")
KV_CACHE_DTYPES: dict[str, tuple[str, ...]] = {
    "FLASH_ATTN": (*_BASE_KV_DTYPES, "fp8", "fp8_e4m3"),
    "FLASHINFER": (*_BASE_KV_DTYPES, "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "nvfp4_4over6"),
    "TRITON_ATTN": (
        *_BASE_KV_DTYPES,
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
        "int4_per_token_head",
        "int8_per_token_head",
        "fp8_per_token_head",
    ),
    "FLEX_ATTENTION": _BASE_KV_DTYPES,
    "CPU_ATTN": (*_BASE_KV_DTYPES, "fp8", "fp8_e4m3", "fp8_e5m2"),
}


def backend_accepts(knob: str, value: Any, backend: str) -> bool:
    """Whether an attention backend takes this value of a knob: block sizes and KV-cache
    dtypes depend on the backend, the other knobs do not."""
    if knob == "block_size":
        return BLOCK_SIZE_RULES[backend].accepts(value)
    if knob == "kv_cache_dtype":
        return value in KV_CACHE_DTYPES[backend]
    return True


def kv_cache_dtype_hint(value: str) -> str:
    """For a KV-cache dtype vLLM does not know (`int4`, `fp4`): the nearest ones it does, each
    with the attention backends that run it, so that the fix names a real value."""
    known = list(KV_CACHE_DTYPE_NAMES)
    lowered = value.strip().lower()
    near = [d for d in known if lowered and d.startswith(lowered)]
    near += [d for d in difflib.get_close_matches(lowered, known, n=3, cutoff=0.5) if d not in near]
    if not near:
        return "use one of " + ", ".join(known)

    def where(dtype: str) -> str:
        backends = [b for b, dtypes in KV_CACHE_DTYPES.items() if dtype in dtypes]
        return f"{dtype} (on {', '.join(backends)})" if backends else f"{dtype} (no backend here)"

    return "nearest: " + "; ".join(where(d) for d in near[:3])


def _value_problem(option: str, value: str, version: str, *, choices_too: bool) -> str | None:
    """Why vLLM's parser would refuse `value` for `option`, if it would."""
    return checks.value_problem(tables.TABLES, option, value, version, choices_too=choices_too)


def _tuned_by_spelling() -> dict[str, Knob]:
    return {spelling: knob for knob in KNOBS for spelling in knob.spellings()}


def _normalise(option: str) -> str:
    """vLLM accepts `--max_num_seqs` for `--max-num-seqs`; compare in the dashed form."""
    if option.startswith("--"):
        return "--" + option[2:].replace("_", "-")
    return option


def extra_flags(extra_args: list[str]) -> list[tuple[int, str]]:
    """The option names in a pass-through argument list, with their index."""
    found = []
    for index, token in enumerate(extra_args):
        if checks.is_value(token):
            continue
        found.append((index, _normalise(token.split("=", 1)[0])))
    return found


def extra_flags_named(extra_args: Sequence[str]) -> set[str]:
    """The option names a pass-through argument list sets, in their dashed form."""
    return {option for _, option in extra_flags(list(extra_args))}


def check_extra_args(
    extra_args: list[str], version: str = PINNED_VERSION, *, exact: bool = True
) -> list[Violation]:
    """Problems with `spec.engine.extraArgs`, each naming the fix."""
    tuned = _tuned_by_spelling()
    known = known_flags(version)
    # A flag pasted with a typographic dash is reported, and checked below as meant.
    extra_args, problems = checks.with_ascii_dashes(extra_args, "vLLM")
    problems += _check_values(extra_args, version, exact=exact)
    for index, option in extra_flags(extra_args):
        where = f"spec.engine.extraArgs[{index}]"
        if option in tuned:
            flag = tuned[option]
            problems.append(
                Violation(
                    where,
                    f"{option} is a tuned setting; set spec.engine.args.{flag.spec_name} "
                    "instead of passing it in extraArgs",
                )
            )
        elif option in MANAGED_FLAGS:
            problems.append(
                Violation(where, f"{option} is managed by slotune: {MANAGED_FLAGS[option]}")
            )
        elif option in known or _is_dotted_json_option(option, known) or _is_opt_level(option):
            continue
        elif (removal := tables.removed_flag(option, version)) is not None:
            fix = tables.REPLACEMENTS.get(option, "remove it")
            problems.append(
                Violation(
                    where,
                    f"{option} was removed {removal.when()}: {fix} (vLLM {version} exits with "
                    "'unrecognized arguments')",
                )
            )
        elif option in NONEXISTENT_FLAGS:
            problems.append(
                Violation(
                    where,
                    f"{option} does not exist in vLLM {version}: {NONEXISTENT_FLAGS[option]}",
                )
            )
        elif (added := tables.added_in(option, version)) is not None:
            problems.append(
                Violation(
                    where,
                    f"{option} is not a flag of vLLM {version} (vLLM exits with 'unrecognized "
                    f"arguments'): it came in vLLM {added}; remove it, or run an image of "
                    f"{added} or later",
                )
            )
        else:
            completions = sorted(f for f in known if f.startswith(option) and f.startswith("--"))
            if completions:
                hint = (
                    f"vLLM would silently read it as {completions[0]}; write the full name"
                    if len(completions) == 1
                    else "it is only the start of " + ", ".join(completions[:4])
                )
                problems.append(Violation(where, f"{option} is not a full vLLM flag name: {hint}"))
            else:
                problems.append(
                    Violation(
                        where,
                        f"{option} is not a flag of vLLM {version} (vLLM exits with "
                        "'unrecognized arguments'); check the name against `vllm serve --help`",
                    )
                )
    return problems


def _check_values(extra_args: list[str], version: str, *, exact: bool = True) -> list[Violation]:
    """Each flag's values counted as vLLM's parser counts them (`extra_args.check_values`)."""
    arity = flag_arity(version)

    def read(name: str) -> tuple[str, str]:
        option = _normalise(name)
        if _is_opt_level(option) and len(option) > 2:
            return option, "0"  # -O3: the level is part of the token
        return option, arity.get(option.split(".", 1)[0], "?" if _is_opt_level(option) else "*")

    def refused(option: str, value: str) -> str | None:
        return _value_problem(option, value, version, choices_too=exact)

    return checks.check_values(extra_args, read, refused, switches=arity, engine="vLLM")


def _is_dotted_json_option(option: str, known: frozenset[str]) -> bool:
    """`-cc.mode=3` / `--compilation-config.mode`: dotted keys of a JSON-valued option."""
    head = option.split(".", 1)[0]
    return "." in option and head in known


def _is_opt_level(option: str) -> bool:
    return re.fullmatch(r"-O[0-3]?", option) is not None


def check_args(args: EngineArgs, backend: AttentionBackend) -> list[Violation]:
    """Rules on the typed settings that vLLM would otherwise find by failing to start."""
    problems: list[Violation] = []
    if (
        args.max_num_batched_tokens is not None
        and args.max_num_seqs is not None
        and args.max_num_batched_tokens < args.max_num_seqs
    ):
        problems.append(
            Violation(
                "spec.engine.args.maxNumBatchedTokens",
                f"{args.max_num_batched_tokens} is below maxNumSeqs {args.max_num_seqs}; "
                "vLLM needs max-num-batched-tokens >= max-num-seqs",
            )
        )
    if args.block_size is not None and not backend_accepts("block_size", args.block_size, backend):
        problems.append(
            Violation(
                "spec.engine.args.blockSize",
                f"{args.block_size} is not valid on {backend}: it must be "
                f"{BLOCK_SIZE_RULES[backend].describe()}",
            )
        )
    if args.kv_cache_dtype is not None and not backend_accepts(
        "kv_cache_dtype", args.kv_cache_dtype, backend
    ):
        problems.append(
            Violation(
                "spec.engine.args.kvCacheDtype",
                f"{args.kv_cache_dtype} is not supported by {backend}; use one of "
                + ", ".join(KV_CACHE_DTYPES[backend]),
            )
        )
    if (
        args.quantization is not None
        and args.quantization.startswith("fp8")
        and (backend == "CPU_ATTN")
    ):
        problems.append(
            Violation(
                "spec.engine.args.quantization",
                f"{args.quantization} weights need a GPU with fp8 units (Hopper, Ada or later); "
                "vLLM's CPU build has no fp8 matmul kernel (its start fails in "
                "_C::static_scaled_fp8_quant): remove it",
            )
        )
    if (
        args.long_prefill_token_threshold is not None
        and args.max_model_len is not None
        and args.long_prefill_token_threshold > args.max_model_len
    ):
        problems.append(
            Violation(
                "spec.engine.args.longPrefillTokenThreshold",
                f"{args.long_prefill_token_threshold} is above maxModelLen {args.max_model_len}; "
                "vLLM refuses to start otherwise",
            )
        )
    return problems


def check_version(args: EngineArgs, version: str, *, exact: bool = True) -> list[Violation]:
    """The typed settings against the flag table of the image's vLLM: a knob whose flag that
    release does not have, or a value its parser does not list."""
    known = known_flags(version)
    table = "" if exact else f" (checked against the table for {version})"
    problems = []
    for knob in KNOBS:
        value = args.explicit().get(knob.field)
        if value is None or not knob.render(value):
            continue
        field = f"spec.engine.args.{knob.spec_name}"
        if knob.flag not in known:
            problems.append(
                Violation(field, f"vLLM {version} has no {knob.flag}{table}: remove it")
            )
            continue
        rendered = knob.render(value)
        if len(rendered) == 2:
            problem = _value_problem(knob.flag, rendered[1], version, choices_too=exact)
            if problem:
                problems.append(Violation(field, problem + table))
    return problems


def check_config(
    args: EngineArgs,
    extra_args: list[str],
    backend: AttentionBackend,
    version: str = PINNED_VERSION,
    *,
    exact: bool = True,
) -> list[Violation]:
    """Every known rule, checked before anything is launched (`exact`: the table is the
    image's own version's)."""
    problems = check_args(args, backend) + check_version(args, version, exact=exact)
    problems += check_extra_args(extra_args, version, exact=exact)
    disables_chunking = any(
        flag in ("--disable-chunked-prefill", "--no-enable-chunked-prefill")
        for _, flag in extra_flags(extra_args)
    )
    if (
        disables_chunking
        and args.max_num_batched_tokens is not None
        and args.max_model_len is not None
        and args.max_num_batched_tokens < args.max_model_len
    ):
        problems.append(
            Violation(
                "spec.engine.args.maxNumBatchedTokens",
                "with chunked prefill disabled it must be at least maxModelLen "
                f"({args.max_model_len}); vLLM refuses to start otherwise",
            )
        )
    return problems


PARALLEL_FLAGS = {
    "--pipeline-parallel-size": "pipeline",
    "-pp": "pipeline",
    "--data-parallel-size": "data",
    "-dp": "data",
}


def check_resources(
    extra_args: list[str], gpus: int, image: str, backend: AttentionBackend | None
) -> list[Violation]:
    """The engine against the pod's GPUs: slotune runs a pod's `resources.gpus` GPUs tensor-
    parallel, so pipeline or data parallelism has no GPUs to run on; and vLLM's GPU build
    cannot start on a pod without a GPU."""
    problems = []
    for index, option, value in checks.flag_uses(extra_args, _normalise, PARALLEL_FLAGS):
        if value.isdigit() and int(value) > 1:
            kind = PARALLEL_FLAGS[option]
            problems.append(
                Violation(
                    f"spec.engine.extraArgs[{index}]",
                    f"{option} {value} needs {int(value)}x the GPUs of tensor parallelism, but "
                    f"the pod has resources.gpus={gpus}, all of them tensor-parallel; {kind} "
                    "parallelism is not supported: remove it (raise resources.gpus for more "
                    "tensor parallelism, or spec.replicas for more copies)",
                )
            )
    cpu_engine = backend == "CPU_ATTN" or "cpu" in image.rsplit("/", 1)[-1].lower()
    if gpus == 0 and not cpu_engine:
        problems.append(
            Violation(
                "spec.resources.gpus",
                f"0 GPUs with {image}, vLLM's GPU build, which cannot start without one: ask "
                "for a GPU, or name the CPU engine (spec.engine.attentionBackend: CPU_ATTN with "
                "a CPU build of vLLM)",
            )
        )
    return problems


def render_tuned_args(args: EngineArgs) -> list[str]:
    """The typed settings as vLLM flags, always in full-name form and a stable order."""
    return render_knobs(KNOBS, args.explicit())
