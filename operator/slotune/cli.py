"""The `slotune` command line: the operator, CRD generation, and offline checks of files.

`slotune validate` and `slotune render` let a GitOps pipeline check an LLMDeployment (schema
and vLLM rules) and see the objects it becomes, before anything reaches a cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from slotune import crdgen, models, render
from slotune.engine import ENGINES
from slotune.settings import SettingsError
from slotune.spec import kind_of, parse_spec, validation_problems

DEFAULT_CRD_DIR = Path("crds")


def _documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def _load_deployments(path: Path) -> tuple[list[models.LLMDeployment], list[str]]:
    found: list[models.LLMDeployment] = []
    problems: list[str] = []
    for index, doc in enumerate(_documents(path)):
        if doc.get("kind") != models.KIND:
            continue
        where = f"{path}#{index}"
        try:
            deployment = models.LLMDeployment.model_validate(doc)
        except ValidationError as error:
            kind = kind_of(doc.get("spec") or {})
            problems += [f"{where}: {p}" for p in validation_problems(error, "", kind)]
            continue
        # The Kubernetes client's models check the free-form fields; loaded here only, so
        # that the other commands start without the client.
        from slotune.kube import schema_problems  # noqa: PLC0415

        _, rule_problems = parse_spec(doc.get("spec") or {}, schema_problems)
        problems += [f"{where}: {p}" for p in rule_problems]
        found.append(deployment)
    return found, problems


def cmd_crds(args: argparse.Namespace) -> int:
    if args.action == "generate":
        path = crdgen.generate(args.dir)
        print(f"Wrote {path}")
        return 0
    problems = crdgen.check(args.dir)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{args.dir / crdgen.CRD_FILE} matches the models")
    return 1 if problems else 0


def upgrade_problems(
    deployment: models.LLMDeployment, version: str, reported: list[str]
) -> tuple[list[str], str]:
    """What moving a deployment's engine to `version` breaks, checked against that version's
    flag table, less what is `reported` already (the version is the image's own); and a
    warning where its engine has no tables to check against."""
    given = deployment.spec.engine
    engine = ENGINES.get(given.kind)
    if engine is None:
        return [], ""  # the kind itself is reported with the spec's problems
    if not engine.flag_table_versions:
        return [], f"--engine-version: slotune has no flag tables of {engine.title}; not checked"
    if version not in engine.flag_table_versions:
        return [
            f"--engine-version: slotune has no flag table for {engine.title} {version} (it has "
            f"{', '.join(engine.flag_table_versions)})"
        ], ""
    found = engine.check_config(
        given.args, given.extra_args, given.attention_backend, given.image, version=version
    )
    return [
        f"with {engine.title} {version}: {violation}"
        for violation in map(str, found)
        if not any(problem.endswith(f": {violation}") for problem in reported)
    ], ""


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        deployments, problems = _load_deployments(path)
        for problem in problems:
            print(problem, file=sys.stderr)
        for deployment in deployments:
            name = deployment.metadata.name
            engine = ENGINES.get(deployment.spec.engine.kind)
            notes = [engine.image_note(deployment.spec.engine.image) if engine else ""]
            if args.engine_version:
                upgrade, note = upgrade_problems(deployment, args.engine_version, problems)
                problems += [f"{path}: {name}: {problem}" for problem in upgrade]
                notes.append(note)
                for problem in upgrade:
                    print(f"{path}: {name}: {problem}", file=sys.stderr)
            for note in filter(None, notes):
                print(f"{path}: {name}: warning: {note}", file=sys.stderr)
        failed = failed or bool(problems)
        if not problems:
            upgraded = f" for engine version {args.engine_version}" if args.engine_version else ""
            print(f"{path}: {len(deployments)} LLMDeployment(s) valid{upgraded}")
    return 1 if failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    deployments, problems = _load_deployments(args.file)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    out: list[dict[str, Any]] = []
    for deployment in deployments:
        owner = render.Owner(
            name=deployment.metadata.name,
            namespace=deployment.metadata.namespace,
            uid=deployment.metadata.uid or "00000000-0000-0000-0000-000000000000",
        )
        out += render.render_children(
            owner, deployment.spec, pod_monitor_crd_present=args.pod_monitor
        )
    print(yaml.safe_dump_all(out, sort_keys=False), end="")
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    from slotune import handlers  # noqa: PLC0415 - Kopf is loaded only to run the operator

    try:
        handlers.run(
            namespaces=args.namespace or [],
            kubeconfig=args.kubeconfig,
            liveness_endpoint=args.liveness,
        )
    except SettingsError as error:
        print(f"slotune operator: {error}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotune", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    operator = commands.add_parser("operator", help="run the operator")
    operator.add_argument(
        "--namespace", action="append", help="watch only this namespace (repeatable)"
    )
    operator.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster or ~/.kube)")
    operator.add_argument(
        "--liveness",
        default=None,
        help="serve a liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    operator.set_defaults(func=cmd_operator)

    crds = commands.add_parser("crds", help="generate or check the CRD YAML")
    crds.add_argument("action", choices=["generate", "check"])
    crds.add_argument("--dir", type=Path, default=DEFAULT_CRD_DIR)
    crds.set_defaults(func=cmd_crds)

    validate = commands.add_parser(
        "validate", help="check LLMDeployment files against the API and vLLM's rules"
    )
    validate.add_argument("files", type=Path, nargs="+")
    validate.add_argument(
        "--engine-version",
        metavar="VERSION",
        help="also check each spec against this engine version's flag table (e.g. 0.32.0): "
        "what upgrading its image to that version breaks",
    )
    validate.set_defaults(func=cmd_validate)

    render_cmd = commands.add_parser("render", help="print the objects an LLMDeployment becomes")
    render_cmd.add_argument("file", type=Path)
    render_cmd.add_argument(
        "--pod-monitor", action="store_true", help="render as if the PodMonitor CRD exists"
    )
    render_cmd.set_defaults(func=cmd_render)
    loadgen_cmd = commands.add_parser(
        "loadgen",
        help="drive an OpenAI-compatible endpoint and report latency percentiles and goodput",
        add_help=False,
    )
    loadgen_cmd.add_argument("flags", nargs=argparse.REMAINDER, help="see slotune loadgen --help")
    trial_cmd = commands.add_parser(
        "trial-load",
        help="measure one trial's engine under a workload (what a trial's load Job runs)",
        add_help=False,
    )
    trial_cmd.add_argument("flags", nargs=argparse.REMAINDER, help="see slotune trial-load --help")
    tune_cmd = commands.add_parser(
        "tune", help="tune the engine for an LLMDeployment's SLO (--local: on this machine)"
    )
    tune_cmd.add_argument("flags", nargs=argparse.REMAINDER, help="see slotune tune --help")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["loadgen"]:
        # The load generator owns its flags (and its --help).
        from slotune.measure import loadgen  # noqa: PLC0415 - aiohttp is loaded only to drive load

        return loadgen.main(argv[1:])
    if argv[:1] == ["trial-load"]:
        from slotune.measure import probe  # noqa: PLC0415 - aiohttp is loaded only to drive load

        return probe.trial_load_main(argv[1:])
    if argv[:1] == ["tune"]:
        from slotune.local import runner  # noqa: PLC0415 - Optuna is loaded only to tune

        return runner.main(argv[1:])
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
