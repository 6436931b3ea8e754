"""How much a configuration's capacity moves between engine starts, beyond one start's interval.

Reads a recorded landscape (`bench/landscapes/*.jsonl`, written by `bench/landscape.py`): every
point is one engine start of one configuration with every probe's attainment kept. Each point
is refitted with `slotune.measure.crossing` (the capacity estimate and this start's interval),
and the configurations measured on more than one start give the variance components in ln rate:

- within a start: each point's own interval, read as a standard deviation (`crossing.log_sd`);
- between starts: what the repeats' spread holds beyond that. With n_i starts of configuration
  i, the sum of squares of their ln estimates about their mean has expectation
  sum_i sum_j (w_ij^2 + sigma_b^2) (n_i - 1) / n_i, so sigma_b^2 is the excess over the
  within-start part, divided by the degrees of freedom (method of moments; 0 where the repeats
  spread no more than their intervals say). Its 90% interval comes from a bootstrap over
  configurations.

The figure is per platform: it is what `Platform.spread` holds (`tuner/space.py`).
Run: `python bench/variance_components.py bench/landscapes/cpu-tune-example.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path
from statistics import NormalDist

import yaml

from slotune.measure import crossing
from slotune.measure.capacity import Capacity, fit_probes, with_fit
from slotune.models import LLMDeployment


def _percentiles(spec_text: str) -> dict[str, float]:
    spec = LLMDeployment.model_validate(yaml.safe_load(spec_text)).spec
    if spec.slo is None:
        raise SystemExit("the landscape's spec has no SLO")
    return {name: t.percentile for name, t in spec.slo.targets().items()}


def refit(found: Capacity, percentiles: dict[str, float]) -> Capacity:
    """The recorded capacity with the fit of its own probes (its bracket as recorded)."""
    fitted = fit_probes(found.probes, percentiles)
    if fitted is None:
        return found
    low, high = fitted.interval()
    return with_fit(found, fitted.estimate, low, high)


def components(groups: list[list[Capacity]]) -> tuple[float, float, int]:
    """(sigma_b, mean within-start sd, degrees of freedom) over configurations with repeats."""
    squares = within = 0.0
    dof = 0
    for starts in groups:
        logs = [math.log(c.rate) for c in starts]
        sds = [crossing.log_sd(c.rate, c.low or 0.0, c.high) for c in starts]
        if len(logs) < 2 or not all(math.isfinite(s) for s in sds):
            continue
        mean = sum(logs) / len(logs)
        n = len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        within += sum(s**2 for s in sds) * (n - 1) / n
        dof += n - 1
    if dof == 0:
        return math.nan, math.nan, 0
    sigma_b2 = max(0.0, (squares - within) / dof)
    return math.sqrt(sigma_b2), math.sqrt(within / dof), dof


MIN_GROUPS_FOR_BOOTSTRAP = 5


def _chi_square(p: float, dof: int) -> float:
    """The chi-square quantile (Wilson-Hilferty's approximation, within 1% from 3 d.f.)."""
    z = NormalDist().inv_cdf(p)
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square_interval(sigma_b: float, within: float, dof: int) -> tuple[float, float]:
    """90% interval of sigma_b: the repeats' total variance (sigma_b^2 + within^2) has a scaled
    chi-square distribution with `dof` degrees of freedom; the within part is taken as known."""
    total = sigma_b**2 + within**2
    ends = (dof * total / _chi_square(0.95, dof), dof * total / _chi_square(0.05, dof))
    low, high = (math.sqrt(max(0.0, end - within**2)) for end in ends)
    return low, high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscape", type=Path)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    lines = [json.loads(line) for line in args.landscape.read_text().splitlines() if line]
    runs = {line["run"]["started"]: line["run"] for line in lines if "run" in line}
    spec_text = next(iter(runs.values()))["spec"]
    percentiles = _percentiles(spec_text)
    by_config: dict[str, list[Capacity]] = defaultdict(list)
    for line in lines:
        if "point" not in line:
            continue
        record = line["point"]["record"]
        found = (record.get("measurement") or {}).get("capacity")
        if not found or not found.get("probes"):
            continue
        key = json.dumps(record["params"], sort_keys=True)
        by_config[key].append(refit(Capacity.model_validate(found), percentiles))
    print(f"{args.landscape}: {sum(map(len, by_config.values()))} points, "
          f"{len(by_config)} configurations, SLO percentiles {percentiles}")  # fmt: skip
    for key, starts in by_config.items():
        params = json.loads(key)
        short = ", ".join(f"{k}={v}" for k, v in params.items() if k.startswith("max_num"))
        shown = "; ".join(
            f"{c.rate:.3g} [{c.low or 0:.3g}, {c.high if c.high is not None else '?'}]"
            f" (bracket {c.capacity:.3g})"
            for c in starts
        )
        print(f"  {short}: {shown}")
    groups = [starts for starts in by_config.values() if len(starts) > 1]
    sigma_b, within, dof = components(groups)
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible bootstrap
    draws = []
    for _ in range(args.bootstrap):
        sample = [rng.choice(groups) for _ in groups]
        b, _, d = components(sample)
        if d:
            draws.append(b)
    draws.sort()
    if len(groups) >= MIN_GROUPS_FOR_BOOTSTRAP:
        low = draws[int(0.05 * len(draws))] if draws else math.nan
        high = draws[int(0.95 * len(draws)) - 1] if draws else math.nan
        how = "90% bootstrap over configurations"
    else:  # too few configurations to resample: the chi-square interval of the total spread
        low, high = chi_square_interval(sigma_b, within, dof)
        how = "90% chi-square interval"
    print(
        f"Between starts: sigma_b {sigma_b:.3f} in ln rate ({math.exp(sigma_b) - 1:.1%}), "
        f"{how} [{low:.3f}, {high:.3f}], from {len(groups)} configurations with "
        f"repeats ({dof} degrees of freedom); within a start: mean sd {within:.3f}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
