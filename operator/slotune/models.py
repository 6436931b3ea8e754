"""The LLMDeployment API: pydantic models for spec and status.

These models are the single source of truth for the API. The CRD in `crds/` is generated
from them (`slotune crds generate`), and the cross-field rules the API server enforces at
`kubectl apply` time (CEL, `x-kubernetes-validations`) are declared here beside the Python
validators that check the same thing for local files.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

GROUP = "slotune.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
SINGULAR = "llmdeployment"
SHORT_NAMES = ["llmd"]

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.33.0"

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One CEL rule for `x-kubernetes-validations`, enforced by the API server."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


_NOT_A_DURATION = "must be a duration: a number and a unit, e.g. 30s, 5m or 1h30m (ms, s, m, h)"


def _duration(value: str) -> str:
    if not _DURATION.fullmatch(value):
        raise ValueError(f"{value!r} {_NOT_A_DURATION}")
    return value


# Checked by a rule with a message rather than a bare pattern, which would answer with the
# regular expression alone.
Duration = Annotated[
    str,
    AfterValidator(_duration),
    Field(
        max_length=32,
        json_schema_extra={
            "example": "5m",
            "x-kubernetes-validations": [
                cel(f"self.matches('{_DURATION.pattern}')", _NOT_A_DURATION)
            ],
        },
    ),
]


def seconds(duration: str) -> float:
    """Seconds in a duration such as `500ms`, `5m` or `1h30m` (Prometheus' notation)."""
    parts = _DURATION_PART.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r} (write e.g. 90s, 5m or 1h30m)")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


# --- model source -------------------------------------------------------------------------


class SecretKeyRef(ApiModel):
    """A key of a Secret in the LLMDeployment's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(default="token", min_length=1, description="Key inside the Secret.")


class HuggingFaceSource(ApiModel):
    """Download the model from the Hugging Face Hub inside the pod."""

    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hub token, for gated or private models."
    )


class PvcSource(ApiModel):
    """Serve the model from a PersistentVolumeClaim that already holds it."""

    claim_name: str = Field(min_length=1, description="Name of the PersistentVolumeClaim.")
    path: str = Field(
        default="",
        description="Folder of the model inside the volume; empty for the volume's root.",
    )


class ImageSource(ApiModel):
    """Serve the model from an OCI image that holds it, mounted as a read-only image volume."""

    reference: str = Field(
        min_length=1,
        max_length=512,
        description="The image, as a container's image is written (registry/name:tag or "
        "registry/name@sha256:...). Needs Kubernetes 1.35 or later (1.33 and 1.34: the "
        "ImageVolume feature gate on), and a container runtime with image volumes.",
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None,
        description="When the node pulls it; unset: Always for a :latest tag, IfNotPresent "
        "otherwise.",
    )
    path: str = Field(
        default="",
        description="Folder of the model inside the image; empty for the image's root.",
    )


class RandomWeightsSource(ApiModel):
    """No weights: the model's architecture (its config.json) with random weights, which is
    all a load test or a latency benchmark needs (`--load-format dummy`)."""


_ONE_SOURCE = (
    "set exactly one of model.source.huggingFace, model.source.pvc, model.source.image or "
    "model.source.randomWeights"
)


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of huggingFace, pvc, image or randomWeights."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "[has(self.huggingFace), has(self.pvc), has(self.image), "
                    "has(self.randomWeights)].exists_one(x, x)",
                    _ONE_SOURCE,
                )
            ]
        }
    )

    hugging_face: HuggingFaceSource | None = None
    pvc: PvcSource | None = None
    image: ImageSource | None = None
    random_weights: RandomWeightsSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [self.hugging_face, self.pvc, self.image, self.random_weights]
        if sum(source is not None for source in given) != 1:
            raise ValueError(_ONE_SOURCE)
        return self


_NAME_RULE = "!{0}.startsWith('-') && {0}.matches('^[^\\x00-\\x1f\\x7f]*$')"
_NAME_MESSAGE = "must not start with '-' (vLLM would read it as a flag) nor hold control characters"


class ModelSpec(ApiModel):
    """The model to serve."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(_NAME_RULE.format("self.name"), f"model.name {_NAME_MESSAGE}", ".name"),
                cel(
                    "!has(self.servedName) || " + _NAME_RULE.format("self.servedName"),
                    f"model.servedName {_NAME_MESSAGE}",
                    ".servedName",
                ),
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Name clients use in requests, and the model_name label on vLLM metrics; "
        "defaults to the LLMDeployment's name.",
    )
    source: ModelSource = Field(
        default_factory=lambda: ModelSource(hugging_face=HuggingFaceSource()),
        description="Where the weights come from.",
    )

    @model_validator(mode="after")
    def _names_are_not_flags(self) -> ModelSpec:
        for field, value in (("name", self.name), ("servedName", self.served_name)):
            if value is not None and (
                value.startswith("-") or re.search(r"[\x00-\x1f\x7f]", value)
            ):
                raise ValueError(f"model.{field} {_NAME_MESSAGE}: {value!r}")
        return self


# --- engine -------------------------------------------------------------------------------

KvCacheDtypeName = Literal[
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
]
KV_CACHE_DTYPE_NAMES: tuple[str, ...] = get_args(KvCacheDtypeName)
"""Every KV-cache dtype vLLM's --kv-cache-dtype takes (its `CacheDType`)."""


def _kv_cache_dtype_rule() -> JsonDict:
    """The CRD's check of a KV-cache dtype: a CEL rule, not an enum. The API server skips
    every CEL rule once an enum has refused a value, and an enum's refusal lists the 22
    values without saying which one was meant; this rule's message names the dtypes of the
    family written (`int4` → `int4_per_token_head`). `slotune validate` names the nearest
    dtypes too, with `difflib` and the backends that run them (`engine.vllm.rules.
    kv_cache_dtype_hint`), which CEL cannot do within its budget."""
    known = "[" + ", ".join(f"'{d}'" for d in KV_CACHE_DTYPE_NAMES) + "]"
    # The dtypes by family (the part before the first '_'): a value that begins with a
    # family's name, or with which one begins, gets that family. Written out as a chain of
    # conditions: a filtered list's cost is more than the API server's budget for a message.
    families: dict[str, list[str]] = {}
    for dtype in KV_CACHE_DTYPE_NAMES:
        families.setdefault(dtype.split("_")[0], []).append(dtype)
    message = "'use one of ' + '" + ", ".join(KV_CACHE_DTYPE_NAMES) + "'"
    written = "self.lowerAscii()"
    for family, members in reversed(families.items()):
        begins = (
            f"({written}.startsWith('{family}') "
            f"|| (size(self) >= 3 && '{family}'.startsWith({written})))"
        )
        message = f"{begins} ? 'nearest: {', '.join(members)}' : {message}"
    message = f'"\'" + self + "\' is not a KV-cache dtype of vLLM\'s; " + ({message})'
    return {
        "type": "string",
        "maxLength": 32,
        "x-kubernetes-validations": [{"rule": f"self in {known}", "messageExpression": message}],
    }


KvCacheDtype = Annotated[KvCacheDtypeName, WithJsonSchema(_kv_cache_dtype_rule())]


MODEL_FREE_SPECULATION = ("ngram", "suffix", "ngram_gpu")
"""Speculative methods that propose tokens without a model of their own."""


class SpeculativeConfig(ApiModel):
    """vLLM's --speculative-config, as much of it as slotune sets."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(self.method in ['ngram', 'suffix', 'ngram_gpu']) || !has(self.draftModel)",
                    "draftModel goes with a method that has a model (draft_model, eagle, "
                    "...), not with ngram, suffix or ngram_gpu",
                ),
                cel(
                    "self.method != 'draft_model' || has(self.draftModel)",
                    "method draft_model needs draftModel",
                ),
            ]
        }
    )

    method: str = Field(
        max_length=64,
        pattern=r"^[a-z0-9_]+$",
        description="vLLM's method: ngram (tokens that followed the same n-gram earlier in "
        "the prompt), suffix (a suffix tree of the prompt and earlier answers), draft_model (a "
        "smaller model, draftModel), or a method of the model's own (eagle, eagle3, mtp, ...).",
    )
    num_speculative_tokens: int = Field(
        ge=1, le=16, description="Tokens proposed per step (num_speculative_tokens)."
    )
    draft_model: str | None = Field(
        default=None,
        max_length=256,
        description="The draft model, for method draft_model only.",
    )

    @model_validator(mode="after")
    def _draft_model_with_its_method(self) -> SpeculativeConfig:
        if self.method in MODEL_FREE_SPECULATION and self.draft_model is not None:
            raise ValueError(
                "draftModel goes with a method that has a model (draft_model, eagle, ...), "
                "not with ngram, suffix or ngram_gpu"
            )
        if self.method == "draft_model" and self.draft_model is None:
            raise ValueError("method draft_model needs draftModel")
        return self

    def flag_value(self) -> str:
        """The JSON vLLM's --speculative-config takes."""
        value: dict[str, Any] = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.draft_model is not None:
            value = {"model": self.draft_model, **value}
        return json.dumps(value, separators=(",", ":"))


class EngineArgs(ApiModel):
    """The vLLM engine settings slotune knows and tunes; unset means vLLM's own default."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxNumBatchedTokens) || !has(self.maxNumSeqs)"
                    " || self.maxNumBatchedTokens >= self.maxNumSeqs",
                    "maxNumBatchedTokens must be at least maxNumSeqs (vLLM refuses to start"
                    " otherwise)",
                ),
            ]
        }
    )

    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description="Token budget per engine step, also the chunked-prefill chunk budget "
        "(--max-num-batched-tokens). Larger lowers TTFT, smaller lowers inter-token latency.",
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Tokens per KV-cache block (--block-size); a multiple of the attention "
        "backend's kernel size (16 on FlashAttention).",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of each GPU's memory vLLM may use (--gpu-memory-utilization).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=65536, description="Sequences per step (--max-num-seqs)."
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Context length in tokens (--max-model-len)."
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="Reuse KV blocks of shared prompt prefixes "
        "(--enable-prefix-caching / --no-enable-prefix-caching).",
    )
    kv_cache_dtype: KvCacheDtype | None = Field(
        default=None,
        description="KV-cache data type (--kv-cache-dtype). The fp8 and smaller types are "
        "lossy: a study tunes them only with spec.tuning.quality.allowLossy.",
    )
    quantization: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9_-]+$",
        description="--quantization: none (the checkpoint's own weights, no flag), a "
        "checkpoint's method (awq, gptq, ...), or weights quantized at load: fp8 (online "
        "dynamic, only on GPUs with fp8 units: Hopper, Ada and later) and vLLM's other online "
        "methods, which are lossy.",
    )
    long_prefill_token_threshold: int | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="Most prefill tokens one request may schedule per step while others wait "
        "(--long-prefill-token-threshold; 0 is off). At most maxModelLen.",
    )
    speculative: SpeculativeConfig | None = Field(
        default=None,
        description="Speculative decoding (--speculative-config): the model-free n-gram or "
        "suffix methods, or a draft model.",
    )

    @model_validator(mode="after")
    def _batched_tokens_cover_seqs(self) -> EngineArgs:
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                "maxNumBatchedTokens must be at least maxNumSeqs (vLLM refuses to start otherwise)"
            )
        return self

    def explicit(self) -> dict[str, Any]:
        """The settings the user (or a trial) fixed, by Python field name."""
        return self.model_dump(exclude_none=True)


AttentionBackend = Literal["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "CPU_ATTN"]


FreeForm = Annotated[
    dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]


class EngineVar(ApiModel):
    """An environment variable for the engine container."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = Field(default="", max_length=16384)


_API_KEY_IN_ENV = (
    "engine.env must not set VLLM_API_KEY: a key in a spec is readable by anyone who can read "
    "the LLMDeployment; put it in a Secret and name it in engine.apiKeySecretRef"
)


_KIND_FIXED = (
    "engine.kind cannot change: the serving pods' selector names the engine; create a new "
    "LLMDeployment for another engine"
)


class EngineSpec(ApiModel):
    """The engine: which one, its image, typed settings and pass-through flags."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.env) || self.env.all(e, e.name != 'VLLM_API_KEY')",
                    _API_KEY_IN_ENV,
                    ".env",
                ),
                # The serving pods' selector names the engine, and a Deployment's selector
                # cannot change.
                # Unset means vllm (the CRD sets no defaults: a spec stays as it was written).
                cel(
                    "(has(self.kind) ? self.kind : 'vllm') == "
                    "(has(oldSelf.kind) ? oldSelf.kind : 'vllm')",
                    _KIND_FIXED,
                    ".kind",
                ),
            ]
        }
    )

    kind: str = Field(
        default="vllm",
        min_length=1,
        max_length=32,
        pattern=r"^[a-z][a-z0-9-]*$",
        description="The inference engine, by the name of its adapter: vllm (the default), or "
        "another slotune runs (an unknown one is reported in the Ready condition, with those "
        "it knows). Fixed once created.",
    )
    image: str = Field(
        default=DEFAULT_ENGINE_IMAGE, min_length=1, max_length=512, description="vLLM image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    args: EngineArgs = Field(default_factory=EngineArgs)
    extra_args: list[Annotated[str, Field(max_length=16384)]] = Field(
        default_factory=list,
        max_length=128,
        description="Further vLLM flags, passed as they are. A flag slotune manages (the "
        "typed args, --model, --port, --host, --served-model-name) is an error here.",
    )
    env: list[EngineVar] = Field(default_factory=list, max_length=64)
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="A Secret key holding the API key vLLM requires on /v1 (as VLLM_API_KEY); "
        "trial load Jobs send it too. Never a plain --api-key in extraArgs.",
    )
    attention_backend: AttentionBackend = Field(
        default="FLASH_ATTN",
        description="Attention backend the engine will use; decides which block sizes "
        "are valid (FLASH_ATTN and TRITON_ATTN: multiples of 16; CPU_ATTN: multiples of 32).",
    )
    security_context: FreeForm = Field(
        default_factory=dict,
        description="The engine container's securityContext, as written (for PSA restricted: "
        "allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}).",
    )
    shm_size: str = Field(
        default="2Gi",
        pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)?$",
        description="Size of the shared-memory volume mounted at /dev/shm.",
    )

    @model_validator(mode="after")
    def _no_key_in_plain_text(self) -> EngineSpec:
        if any(var.name == "VLLM_API_KEY" for var in self.env):
            raise ValueError(_API_KEY_IN_ENV)
        return self


# --- resources and scheduling -------------------------------------------------------------

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"


class ResourceSpec(ApiModel):
    """What each serving pod gets."""

    gpus: int = Field(default=1, ge=0, le=16, description="GPUs per pod (tensor parallel size).")
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Extended resource name of the GPU.",
    )
    cpu: str | None = Field(default=None, pattern=_QUANTITY, description="CPU request.")
    memory: str | None = Field(default=None, pattern=_QUANTITY, description="Memory request.")


class SchedulingSpec(ApiModel):
    """Pod placement, passed through to the serving pods as written."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=64)
    tolerations: list[FreeForm] = Field(default_factory=list, max_length=64)
    affinity: FreeForm = Field(default_factory=dict)
    priority_class_name: str | None = Field(default=None, max_length=253)


# --- caches -------------------------------------------------------------------------------


class CacheClaim(ApiModel):
    """A PersistentVolumeClaim in the LLMDeployment's namespace."""

    claim_name: str = Field(
        min_length=1, max_length=253, description="Name of the PersistentVolumeClaim."
    )


class CacheSpec(ApiModel):
    """The volume the pods keep the model and engine caches on."""

    pvc: CacheClaim = Field(
        description="The claim, mounted read-write by every serving and trial pod: "
        "ReadWriteMany, or ReadWriteOnce where all of them run on the node that holds it."
    )


# --- SLO ----------------------------------------------------------------------------------


class SloTarget(ApiModel):
    """A latency percentile that must stay under a bound."""

    percentile: float = Field(default=95, gt=0, lt=100, description="e.g. 95 for p95.")
    max_seconds: float = Field(gt=0, description="Upper bound of that percentile, in seconds.")


class SloSpec(ApiModel):
    """The service-level objectives; every target given must hold."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.ttft) || has(self.tpot) || has(self.itl) || has(self.e2e)",
                    "give at least one SLO target (ttft, tpot, itl or e2e)",
                )
            ]
        }
    )

    ttft: SloTarget | None = Field(default=None, description="Time to first token.")
    tpot: SloTarget | None = Field(default=None, description="Time per output token.")
    itl: SloTarget | None = Field(default=None, description="Inter-token latency.")
    e2e: SloTarget | None = Field(
        default=None, alias="e2e", description="End-to-end request latency."
    )
    window: Duration = Field(default="5m", description="Window the SLO is judged over.")

    @model_validator(mode="after")
    def _some_target(self) -> SloSpec:
        if not self.targets():
            raise ValueError("give at least one SLO target (ttft, tpot, itl or e2e)")
        return self

    def targets(self) -> dict[str, SloTarget]:
        """The targets that are set, by metric name."""
        found = {"ttft": self.ttft, "tpot": self.tpot, "itl": self.itl, "e2e": self.e2e}
        return {name: target for name, target in found.items() if target is not None}


# --- tuning -------------------------------------------------------------------------------


class _Range(ApiModel):
    """A range to search (min/max) or a list of values; subclasses give the field types."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.min) || !has(self.max) || self.min <= self.max",
                    "min must not exceed max",
                ),
                cel(
                    "!(has(self.values) && (has(self.min) || has(self.max)))",
                    "give either values or min/max, not both",
                ),
            ]
        }
    )

    if TYPE_CHECKING:  # the fields, typed by each subclass
        min: float | None
        max: float | None
        values: list[int] | list[float] | None

    @model_validator(mode="after")
    def _consistent(self) -> _Range:
        low, high, values = self.min, self.max, self.values
        if low is not None and high is not None and low > high:
            raise ValueError("min must not exceed max")
        if values is not None and (low is not None or high is not None):
            raise ValueError("give either values or min/max, not both")
        return self


class IntRange(_Range):
    """An integer range to search, or a list of values."""

    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)
    values: list[int] | None = Field(default=None, min_length=1, max_length=64)


class FloatRange(_Range):
    """A real range to search, or a list of values."""

    min: float | None = Field(default=None, gt=0, le=1)
    max: float | None = Field(default=None, gt=0, le=1)
    values: list[float] | None = Field(default=None, min_length=1, max_length=64)


class SearchSpace(ApiModel):
    """Narrows (or fixes) the default search ranges of the tuned settings."""

    max_num_batched_tokens: IntRange | None = None
    block_size: IntRange | None = None
    gpu_memory_utilization: FloatRange | None = None
    max_num_seqs: IntRange | None = None
    enable_prefix_caching: list[bool] | None = Field(default=None, min_length=1, max_length=2)
    kv_cache_dtype: list[KvCacheDtype] | None = Field(default=None, min_length=1, max_length=8)
    quantization: list[Annotated[str, Field(max_length=64, pattern=r"^[a-z0-9_-]+$")]] | None = (
        Field(default=None, min_length=1, max_length=8)
    )


class LengthDistribution(ApiModel):
    """Token lengths of requests: a mean with a uniform spread around it."""

    mean: int = Field(ge=1, le=1 << 20)
    spread: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Lengths drawn uniformly from mean * [1 - spread, 1 + spread].",
    )


class WorkloadSpec(ApiModel):
    """The load trials are measured under."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.source != 'Synthetic'"
                    " || (has(self.promptTokens) && has(self.outputTokens)"
                    " && (has(self.requestRate) || has(self.concurrency)))",
                    "a Synthetic workload needs promptTokens, outputTokens and a requestRate"
                    " or a concurrency",
                ),
                cel(
                    "!(has(self.requestRate) && has(self.concurrency))",
                    "give either requestRate (open loop) or concurrency (closed loop), not both",
                ),
            ]
        }
    )

    source: Literal["Live", "Synthetic"] = Field(
        default="Live",
        description="Live: shaped like the traffic Prometheus saw; Synthetic: as given here.",
    )
    prompt_tokens: LengthDistribution | None = None
    output_tokens: LengthDistribution | None = None
    request_rate: float | None = Field(
        default=None, gt=0, description="Poisson arrivals per second (open loop)."
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=4096, description="Requests in flight (closed loop)."
    )
    shared_prefix_ratio: float = Field(
        default=0.0, ge=0, le=1, description="Share of each prompt common to all requests."
    )
    duration: Duration = Field(default="60s", description="Measured time per trial.")

    @model_validator(mode="after")
    def _complete(self) -> WorkloadSpec:
        if self.source == "Synthetic" and (
            self.prompt_tokens is None
            or self.output_tokens is None
            or (self.request_rate is None and self.concurrency is None)
        ):
            raise ValueError(
                "a Synthetic workload needs promptTokens, outputTokens and a requestRate "
                "or a concurrency"
            )
        if self.request_rate is not None and self.concurrency is not None:
            raise ValueError(
                "give either requestRate (open loop) or concurrency (closed loop), not both"
            )
        return self


class RetuneSpec(ApiModel):
    """When to tune again after the SLO regresses in production."""

    on_slo_violation: bool = True
    after: Duration = Field(default="15m", description="How long a violation must last.")
    cooldown: Duration = Field(default="6h", description="Minimum time between studies.")


LOSSLESS_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
LOSSY_KV_CACHE_DTYPES = frozenset(
    d for d in KV_CACHE_DTYPE_NAMES if d not in LOSSLESS_KV_CACHE_DTYPES
)
"""KV-cache types that store fewer bits than the model computes in: they change its output."""

ONLINE_QUANTIZATION = frozenset(
    {
        "fp8",
        "online",
        "fp8_per_tensor",
        "fp8_per_block",
        "fp8_per_channel",
        "mxfp8",
        "mxfp4",
        "int8_per_channel_weight_only",
        "nvfp4_per_token",
    }
)
"""--quantization methods that quantize the checkpoint's weights at load (vLLM 0.32's
`_ONLINE_SHORTHANDS`, `online`, and `fp8`, its older spelling): they change the model's output.
A checkpoint's own method (awq, gptq, ...) is how its weights already are, and not lossy here."""


def lossy_in_search_space(space: SearchSpace) -> list[str]:
    """The lossy values a search space names, as `field=value`."""
    named = [f"kvCacheDtype={d}" for d in space.kv_cache_dtype or () if d in LOSSY_KV_CACHE_DTYPES]
    named += [f"quantization={q}" for q in space.quantization or () if q in ONLINE_QUANTIZATION]
    return named


class QualitySpec(ApiModel):
    """The quality gate every lossy configuration passes before it can win: its next-token
    distributions against the reference's over the same token sequences. The reference is
    lossless: vLLM's defaults in `tune --local`, the serving pods in the cluster (a lossy
    serving configuration is no reference, and lossy trials are then refused). The default
    bounds are a starting point, to be set from the scenario's own prompts."""

    allow_lossy: bool = Field(
        default=False,
        description="Tune lossy settings (fp8 weights, fp8 and smaller KV caches) too. Each "
        "such trial is gated on quality before it can win.",
    )
    max_mean_kl: float = Field(
        default=0.01,
        ge=0,
        le=100,
        alias="maxMeanKL",
        description="Mean per-token KL divergence from the reference, nats.",
    )
    max_p99_kl: float = Field(
        default=0.2,
        ge=0,
        le=100,
        alias="maxP99KL",
        description="The 99th percentile of per-token KL divergence from the reference, nats.",
    )
    min_agreement: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Share of positions whose most likely next token is the reference's.",
    )
    prompts: int = Field(
        default=16, ge=1, le=256, description="Seeded prompts in the workload's shape."
    )
    max_prompt_tokens: int = Field(
        default=1024,
        ge=16,
        le=8192,
        description="Longer prompts of the workload's shape are cut to this many tokens: "
        "scoring computes the logits of every prompt position, which costs the engine memory.",
    )
    generated_tokens: int = Field(
        default=16,
        ge=0,
        le=256,
        description="Tokens the reference generates after each prompt; those positions are "
        "scored too.",
    )


class TuningSpec(ApiModel):
    """The tuning study."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.quality) && has(self.quality.allowLossy) && self.quality.allowLossy)"
                    " || !has(self.searchSpace)"
                    " || ((!has(self.searchSpace.kvCacheDtype) || self.searchSpace.kvCacheDtype"
                    f".all(d, d in {list(LOSSLESS_KV_CACHE_DTYPES)}))"
                    " && (!has(self.searchSpace.quantization)"
                    " || self.searchSpace.quantization"
                    f".all(q, !(q in {sorted(ONLINE_QUANTIZATION)}))))",
                    "searchSpace names lossy settings (fp8 weights, or a KV cache below 16 "
                    "bits): set tuning.quality.allowLossy: true, so that every such trial passes "
                    "the quality gate before it can win, or remove them",
                ),
                cel(
                    "!(has(self.quality) && has(self.quality.allowLossy)"
                    " && self.quality.allowLossy)"
                    " || !has(self.strategy) || self.strategy != 'InPlace'",
                    "quality.allowLossy needs strategy Canary: the quality gate compares a trial "
                    "with the serving pods, which InPlace would roll to the lossy trial itself",
                ),
            ]
        }
    )

    enabled: bool = False
    apply: Literal["Auto", "Recommend"] = Field(
        default="Auto",
        description="Auto: promote the best configuration; Recommend: only write it to status.",
    )
    strategy: Literal["Canary", "InPlace"] = Field(
        default="Canary",
        description="Canary: trials on extra pods, users untouched; InPlace: roll the "
        "serving pods (no spare GPU).",
    )
    max_trials: int = Field(default=20, ge=1, le=500)
    objective: Literal["Goodput", "Throughput", "Latency"] = Field(
        default="Goodput",
        description="How feasible configurations are ranked. Goodput: capacity, the highest "
        "request rate at which every SLO target holds; Throughput: output tokens/s at that "
        "rate; Latency: the lowest latency against its bound at the target rate.",
    )
    headroom: float = Field(
        default=0.1,
        ge=0,
        le=10,
        description="A configuration is feasible when its capacity is at least the workload's "
        "rate (or the live peak rate) times 1 + headroom.",
    )
    seed: int = Field(default=0, ge=0)
    search_space: SearchSpace = Field(default_factory=SearchSpace)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    retune: RetuneSpec = Field(default_factory=RetuneSpec)
    quality: QualitySpec = Field(default_factory=QualitySpec)

    @model_validator(mode="after")
    def _lossy_only_when_allowed(self) -> TuningSpec:
        if self.quality.allow_lossy and self.strategy == "InPlace":
            raise ValueError(
                "quality.allowLossy needs strategy Canary: the quality gate compares a trial "
                "with the serving pods, which InPlace would roll to the lossy trial itself"
            )
        if not self.quality.allow_lossy:
            named = lossy_in_search_space(self.search_space)
            if named:
                raise ValueError(
                    f"searchSpace names lossy settings ({', '.join(named)}): set "
                    "tuning.quality.allowLossy: true, so that every such trial passes the "
                    "quality gate before it can win, or remove them"
                )
        return self


class MonitoringSpec(ApiModel):
    """Where slotune reads metrics, and how vLLM gets scraped."""

    prometheus_url: str | None = Field(
        default=None,
        alias="prometheusURL",
        pattern=r"^https?://",
        description="Prometheus to read SLO and GPU metrics from; the operator's default if unset.",
    )
    pod_monitor: Literal["Auto", "Enabled", "Disabled"] = Field(
        default="Auto",
        description="Auto: a PodMonitor when the Prometheus Operator's CRD exists, "
        "scrape annotations otherwise.",
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^(https?|grpc)://",
        description="An OpenTelemetry collector the serving and trial engines send a span per "
        "request to (vLLM's --otlp-traces-endpoint); unset, no tracing.",
    )


class EndpointPickerRef(ApiModel):
    """The Service of an Endpoint Picker (EPP) in the LLMDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the EPP's Service.")
    port: int = Field(
        ge=1,
        le=65535,
        description="The Service's port the gateway calls the EPP on (its service port, not "
        "the container's).",
    )
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="When the EPP does not answer: FailClose fails the request; FailOpen lets "
        "the gateway send it to a pod of its own choosing.",
    )


class InferencePoolSpec(ApiModel):
    """An InferencePool (Gateway API Inference Extension) of the serving pods, for a gateway."""

    enabled: bool = Field(
        default=False,
        description="Render an InferencePool named like the LLMDeployment that selects its "
        "serving pods (never trial or load pods) on the engine's port. Needs the "
        "InferencePool CRD in the cluster.",
    )
    endpoint_picker_ref: EndpointPickerRef | None = Field(
        default=None,
        description="The Endpoint Picker that chooses a pod for each request. slotune does "
        "not deploy one: name the EPP you run for this pool. Unset, the pool names none, for "
        "a gateway that provides its own.",
    )


MIN_REPLICAS, MAX_REPLICAS = 1, 10


class ScalingSpec(ApiModel):
    """How many serving replicas run: `spec.replicas` as written, as many as the measured
    capacity needs, or as an external autoscaler sets them through the scale subresource."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # The schema carries no defaults: an unset bound is its default here.
                cel(
                    f"(has(self.minReplicas) ? self.minReplicas : {MIN_REPLICAS}) <= "
                    f"(has(self.maxReplicas) ? self.maxReplicas : {MAX_REPLICAS})",
                    "minReplicas must not exceed maxReplicas",
                )
            ]
        }
    )

    mode: Literal["Fixed", "Capacity", "External"] = Field(
        default="Fixed",
        description="Fixed: spec.replicas. Capacity: ceil(demand x (1 + headroom) / capacity "
        "per replica) within minReplicas..maxReplicas, where demand is the peak arrival rate "
        "over the stabilization window and capacity per replica the serving configuration's "
        "measured capacity. External: an HPA or KEDA sets spec.replicas through the scale "
        "subresource; slotune publishes the figures and never changes the count.",
    )
    min_replicas: int = Field(default=MIN_REPLICAS, ge=1, le=1000)
    max_replicas: int = Field(default=MAX_REPLICAS, ge=1, le=1000)
    stabilization_window: Duration = Field(
        default="5m",
        description="Capacity: the demand is the peak over this window, so the replicas go "
        "up at once and down only when the whole window needs fewer.",
    )
    capacity_per_replica: float | None = Field(
        default=None,
        gt=0,
        description="Capacity: the requests/s one replica carries within the SLO, when no "
        "study has measured the serving configuration (a measured one takes precedence).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"scaling.minReplicas ({self.min_replicas}) must not exceed maxReplicas "
                f"({self.max_replicas})"
            )
        return self


# --- the resource -------------------------------------------------------------------------


class LLMDeploymentSpec(ApiModel):
    """Desired state of an LLMDeployment."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.tuning) || !self.tuning.enabled || has(self.slo)",
                    "tuning.enabled needs an slo to tune for",
                ),
            ]
        }
    )

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Serving replicas in Fixed and External scaling (the scale subresource "
        "writes it); Capacity scaling sets the count itself.",
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    cache: CacheSpec | None = Field(
        default=None,
        description="A volume for the model and engine caches, mounted at /root/.cache by the "
        "serving pods and every trial pod, with the Hugging Face hub cache (HF_HOME) and the "
        "engine's compile caches on it (vLLM: VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, "
        "TRITON_CACHE_DIR): no pod downloads what another has, and a trial that changes only "
        "settings outside vLLM's compile key (gpuMemoryUtilization, enablePrefixCaching) "
        "loads what another compiled. Pods starting together share it safely but for one "
        "race: Triton, Inductor and vLLM's compiled artefact publish each file by renaming a "
        "complete temporary one (a damaged vLLM artefact is compiled again), Hub downloads "
        "too, under a file lock; only vLLM's index vllm_compile_cache.py is rewritten in "
        "place, so a pod reading it while another writes it can fail to start (README: "
        "Shared caches). Unset: an emptyDir per pod, so every start downloads the weights "
        "and compiles again (slow: on an H200, 20-25 s of compilation and graph capture per "
        "start, besides the download).",
    )
    pod_security_context: FreeForm = Field(
        default_factory=dict,
        description="The serving and trial pods' securityContext, as written (for PSA "
        "restricted: runAsNonRoot with a runAsUser the image can run as, and seccompProfile "
        "RuntimeDefault).",
    )
    slo: SloSpec | None = None
    tuning: TuningSpec = Field(default_factory=TuningSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    inference_pool: InferencePoolSpec = Field(default_factory=InferencePoolSpec)

    @model_validator(mode="after")
    def _tuning_needs_slo(self) -> LLMDeploymentSpec:
        if self.tuning.enabled and self.slo is None:
            raise ValueError("tuning.enabled needs an slo to tune for")
        return self


# --- status -------------------------------------------------------------------------------


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    TUNING = "Tuning"
    SLO_MET = "SLOMet"
    METRICS_AVAILABLE = "MetricsAvailable"
    GPU_THROTTLED = "GPUThrottled"


class Phase(StrEnum):
    PENDING = "Pending"
    DEPLOYING = "Deploying"
    READY = "Ready"
    DEGRADED = "Degraded"
    INVALID = "Invalid"
    TUNING = "Tuning"


class StatusModel(BaseModel):
    """Base for status objects: camelCase on the wire, tolerant of fields from newer versions."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(StatusModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: datetime


class SloTargetStatus(StatusModel):
    """One SLO target, as vLLM's histogram in Prometheus shows it over the window."""

    name: Literal["ttft", "tpot", "itl", "e2e"]
    percentile: float
    max_seconds: float
    observed_seconds: float | None = Field(
        default=None,
        description="The percentile interpolated inside the histogram's buckets, for display; "
        "the verdict comes from the bucket counts.",
    )
    met: bool | None = Field(
        default=None, description="Unset when there were no requests or the buckets cannot tell."
    )
    requests: int | None = Field(default=None, description="Observations in the window.")


class SloStatus(StatusModel):
    """Live SLO attainment, as last read from Prometheus."""

    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    met: bool | None = None
    window: str | None = None
    measured_at: datetime | None = None
    request_rate: float | None = Field(
        default=None, description="Requests finished per second over the window."
    )
    targets: list[SloTargetStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    violating_since: datetime | None = Field(
        default=None, description="Since when the SLO has been violated without a break."
    )
    stale: bool = Field(
        default=False,
        description="True while Prometheus cannot be read: the figures are those of measuredAt.",
    )


class ActiveConfig(StatusModel):
    """The engine settings the serving pods run now."""

    args: list[str] = Field(default_factory=list, description="The vLLM flags as rendered.")
    hash: str = ""


class TrialSummary(StatusModel):
    """One tuning trial, as shown in status (bounded history)."""

    number: int
    params: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    state: str = ""
    score: float | None = None
    capacity: float | None = Field(
        default=None, description="Requests/s carried within every SLO target."
    )
    capacity_upper: float | None = Field(
        default=None, description="The lowest rate probed that did not hold the SLO."
    )
    capacity_low: float | None = Field(
        default=None,
        description="The capacity's 95% interval, low end (between-start spread included).",
    )
    capacity_high: float | None = Field(
        default=None, description="Its high end; absent when open above."
    )
    at_target: str | None = Field(
        default=None,
        description="Feasible, Infeasible, or Unresolved: the interval holds the target rate.",
    )
    feasible: bool | None = None
    cause: str | None = None
    quality: str | None = Field(
        default=None,
        description="A lossy configuration against the reference: KL and top-token agreement.",
    )
    spec_decode_acceptance: float | None = Field(
        default=None, description="Accepted over proposed draft tokens (speculative decoding)."
    )


_PARAMS: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}


class TuningState(StrEnum):
    """Where the study is. Terminal states wait for a spec change or a re-tune."""

    TUNING = "Tuning"  # trials are running
    PROMOTING = "Promoting"  # the winner is rolling out to the serving Deployment
    COMPLETED = "Completed"  # promoted and verified, or nothing better was found
    RECOMMENDED = "Recommended"  # apply: Recommend; the winner is in `recommendation`
    ROLLED_BACK = "RolledBack"  # the promoted winner failed its check; the last good is back


class CurrentTrial(StatusModel):
    """The trial in flight: enough to carry on after an operator restart."""

    number: int
    phase: Literal["screen", "finalist"] = "screen"
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_PARAMS)
    seed: int = 0
    of_trial: int | None = None
    step: Literal["Launching", "Measuring", "CleaningUp"] = "Launching"
    since: datetime = Field(description="When the trial entered this step.")
    started_at: datetime
    config_hash: str = ""
    pod: str | None = Field(default=None, description="The trial's engine pod (Canary).")
    pod_uid: str | None = Field(
        default=None, description="The UID of the trial pod slotune created: no other counts."
    )
    job: str | None = Field(default=None, description="The load Job that measures it.")
    job_uid: str | None = Field(
        default=None, description="The UID of the load Job slotune created: no other counts."
    )
    note: str | None = None
    voided: int = Field(
        default=0, description="Load Jobs discarded: completed through a pod they did not make."
    )


class TunedConfig(StatusModel):
    """Tuned settings laid over the spec's engine args on the serving Deployment."""

    params: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_PARAMS)
    trial: int | None = Field(default=None, description="The trial that measured them.")
    study: int | None = None
    hash: str = Field(default="", description="Config hash of the pods that run them.")
    at: datetime | None = None


class ReplicaCapacity(StatusModel):
    """What one replica of a configuration carries within the SLO, as a study confirmed it."""

    hash: str = Field(description="Config hash of the configuration measured.")
    trial: int
    study: int
    rate: float = Field(description="Requests/s carried within every SLO target.")
    low: float | None = Field(default=None, description="Its 95% interval, low end.")
    high: float | None = None


class TuningStatus(StatusModel):
    """Progress of the tuning study."""

    state: TuningState | None = None
    study: int = Field(default=0, description="Studies started so far; this is the latest.")
    reason: str | None = Field(default=None, description="Why the latest study started.")
    spec_hash: str | None = Field(default=None, description="What the study tunes, hashed.")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str | None = None
    current: CurrentTrial | None = None
    trials_completed: int = 0
    trials_failed: int = 0
    max_trials: int | None = None
    target_rate: float | None = Field(
        default=None, description="Requests/s a feasible configuration carries, headroom included."
    )
    best: TrialSummary | None = None
    versus_defaults: str | None = Field(
        default=None,
        description="The winner's capacity against vLLM's defaults, paired: better by X% "
        "[low, high], no meaningful difference (with the resolution), or unstable.",
    )
    trials: list[TrialSummary] = Field(default_factory=list)
    recommendation: dict[str, Any] | None = Field(default=None, json_schema_extra=_PARAMS)
    promoted: TunedConfig | None = Field(
        default=None, description="What the serving Deployment runs on top of the spec."
    )
    last_good: TunedConfig | None = Field(
        default=None, description="What it ran before the promotion: the rollback target."
    )
    verify_since: datetime | None = None
    replica_capacity: ReplicaCapacity | None = Field(
        default=None,
        description="The capacity per replica of the configuration the study chose (the "
        "winner, or else the best): what Capacity scaling divides the demand by while the "
        "serving pods run it.",
    )


class GpuStatus(StatusModel):
    """GPU clocks and memory of the serving pods, from the DCGM exporter."""

    sm_clock_mhz: float | None = Field(
        default=None, alias="smClockMHz", description="The slowest GPU's SM clock."
    )
    max_sm_clock_mhz: float | None = Field(
        default=None,
        alias="maxSmClockMHz",
        description="The highest maximum SM clock (DCGM_FI_DEV_MAX_SM_CLOCK, else the highest "
        "clock seen in the last hour).",
    )
    throttle_reasons: list[str] = Field(
        default_factory=list,
        description="Thermal or power reasons holding some GPU's SM clock below its maximum.",
    )
    memory_used_mib: float | None = Field(
        default=None, alias="memoryUsedMiB", description="The fullest GPU's framebuffer use."
    )
    temperature_c: float | None = Field(
        default=None, alias="temperatureC", description="The hottest GPU's temperature."
    )
    clock_event_reasons: list[str] = Field(
        default_factory=list,
        description="Every reason DCGM gives for the SM clocks now, idle and application "
        "clocks included.",
    )
    gpus: int | None = Field(default=None, description="GPUs read.")
    measured_at: datetime | None = None
    stale: bool = Field(
        default=False,
        description="True while Prometheus cannot be read: the figures are those of measuredAt.",
    )


class ScalingStatus(StatusModel):
    """How many replicas serve, how many the demand needs, and the figures that decided it."""

    mode: str = "Fixed"
    desired_replicas: int | None = Field(
        default=None, description="The replicas slotune set on the serving Deployment."
    )
    needed_replicas: int | None = Field(
        default=None,
        description="ceil(demand x (1 + headroom) / capacity per replica), before the bounds.",
    )
    demand: float | None = Field(
        default=None, description="Peak arrival rate (requests/s) over the stabilization window."
    )
    capacity_per_replica: float | None = Field(
        default=None, description="Requests/s one replica of the serving configuration carries."
    )
    capacity_low: float | None = Field(
        default=None, description="That capacity's 95% interval, low end (when measured)."
    )
    capacity_high: float | None = None
    capacity_source: str | None = Field(
        default=None, description="Where the capacity comes from: a trial, or the spec."
    )
    message: str | None = None
    last_scale_time: datetime | None = None


class LLMDeploymentStatus(StatusModel):
    """Observed state of an LLMDeployment; written only by the operator."""

    observed_generation: int | None = None
    phase: Phase | None = None
    message: str | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    ready: str | None = Field(default=None, description="Ready replicas of desired, e.g. 1/1.")
    selector: str | None = Field(
        default=None,
        description="The serving pods' label selector, for the scale subresource (HPA, KEDA).",
    )
    scaling: ScalingStatus | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    slo: SloStatus | None = None
    slo_summary: str | None = Field(
        default=None, description="TTFT p95 against its target, for `kubectl get`."
    )
    trials_summary: str | None = Field(
        default=None, description="Trials done of the maximum, for `kubectl get`."
    )
    capacity_summary: str | None = Field(
        default=None,
        description="The best capacity found against the rate it must carry, for `kubectl get`.",
    )
    active_config: ActiveConfig | None = None
    tuning: TuningStatus | None = None
    gpu: GpuStatus | None = None
    serving_spec: FreeForm | None = Field(
        default=None,
        description="The last valid spec, which the children run: while `spec` is invalid, "
        "they are kept at (and repaired to) this one.",
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class ObjectMeta(BaseModel):
    """The parts of metadata slotune reads."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    name: str
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None


OBJECT_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
OBJECT_NAME_RULE = cel(
    "size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "metadata.name must be a DNS-1035 label: at most 63 lowercase letters, digits and '-', "
    "starting with a letter and ending with a letter or digit (the Service and the children's "
    "labels take it); write e.g. llama-3-1-8b for llama-3.1-8b",
)
"""What the API server checks of an LLMDeployment's name (the CRD's root rule)."""


class LLMDeployment(BaseModel):
    """A whole LLMDeployment object, as read from a file or the API."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    api_version: Literal["slotune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["LLMDeployment"]
    metadata: ObjectMeta
    spec: LLMDeploymentSpec
    status: LLMDeploymentStatus | None = None

    @model_validator(mode="after")
    def _name_fits_its_children(self) -> LLMDeployment:
        name = self.metadata.name
        if len(name) > 63 or not OBJECT_NAME.fullmatch(name):
            raise ValueError(f"{OBJECT_NAME_RULE['message']} (got {name!r})")
        return self
