"""The optimisation registry and the typed hyper-parameters (common/optimisations.py,
common/hparams.py) on a toy workload."""

from __future__ import annotations

import pytest

from common.dist import DistEnv
from common.errors import UserError
from common.optimisations import (
    Optimisation,
    Registry,
    ablation_variants,
    config_optimisations,
    markdown_table,
    plus_variants,
)
from common.precision import Precision
from common.training import build_parser
from tests.common.toy_workload import OptimisedToy, ToyWorkload


def parse(argv):
    return build_parser(OptimisedToy).parse_args(argv)


def built(argv):
    wl = OptimisedToy(parse(argv), DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    return wl


def test_no_optimisation_named_is_the_plain_build():
    wl = built([])
    assert wl.opts == {} and wl.model.bias is not None
    assert wl.opt.param_groups[0]["lr"] == 0.5 and wl.hp.decay_steps == [4, 6]


def test_optimisations_apply_in_the_registry_order_with_values():
    wl = built(["--opt", "scale-lr=3,halve-lr", "--optimisations", "double-lr", "--opt",
                "no-bias"])
    assert list(wl.opts) == ["double-lr", "halve-lr", "scale-lr", "no-bias"]
    assert wl.opt.param_groups[0]["lr"] == pytest.approx(1.5)
    assert wl.model.bias is None   # selected before build()


def test_compile_and_cuda_graph_are_named_optimisations():
    args = parse(["--opt", "compile=tuned"])
    assert args.compile == "tuned" and args.cuda_graph is False
    assert parse(["--opt", "compile"]).compile == "default"
    assert parse([]).compile == "none"
    with pytest.raises(SystemExit):
        parse(["--compile", "default"])   # not a run flag once a workload has a registry


@pytest.mark.parametrize("argv, words", [
    (["--opt", "halve-lr"], ["halve-lr requires double-lr"]),
    (["--opt", "no-bias,gpu-thing"], ["no-bias and gpu-thing exclude each other"]),
    (["--opt", "nope"], ["unknown optimisation 'nope'"]),
    (["--opt", "double-lr=2"], ["double-lr takes no value"]),
    (["--opt", "scale-lr=x"], ["scale-lr=x"]),
    (["--opt", "compile=fast"], ["compile mode must be one of"]),
    (["--opt", "scale-lr=2,scale-lr=3"], ["given twice"]),
    (["--lr", "0"], ["--lr", "must be more than 0, not 0.0"]),
    (["--hidden", "-1"], ["--hidden", "must be 0 or more"]),
    (["--hidden", "x"], ["--hidden", "expected an integer"]),
    (["--decay-steps", "4,-6"], ["--decay-steps", "must be more than 0, not -6"]),
])
def test_bad_combinations_and_values_are_one_line_parser_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    for w in words:
        assert w in err[0]


def test_environment_is_checked_before_anything_is_built():
    with pytest.raises(UserError, match="gpu-thing needs CUDA"):
        OptimisedToy(parse(["--opt", "gpu-thing"]), DistEnv(), Precision("fp32", "cpu"))
    reg = Registry(Optimisation("one", "x", apply=lambda wl, v: None, single_process=True),
                   Optimisation("bf16", "x", apply=lambda wl, v: None, precisions=("amp-bf16",)))
    with pytest.raises(UserError, match="one runs in one process only"):
        reg.check_environment({"one": None}, "cpu", "fp32", 2)
    with pytest.raises(UserError, match="bf16 runs under --precision amp-bf16, not fp32"):
        reg.check_environment({"bf16": None}, "cpu", "fp32", 1)


def test_help_groups_and_the_listing(capsys):
    text = build_parser(OptimisedToy).format_help()
    for group in ("run:", "hyper-parameters", "optimisations (none named"):
        assert group in text
    assert "halve-lr" in text and "[+double-lr]" in text and "(reference: 4,6)" in text
    assert "--optimisations" not in build_parser(ToyWorkload).format_help()
    with pytest.raises(SystemExit) as exc:
        parse(["--list-optimisations"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.splitlines()[1].startswith("halve-lr")


def test_markdown_table_has_a_row_per_optimisation_with_its_requirements(capsys):
    table = markdown_table(OptimisedToy.optimisations, gains={"double-lr": "2x (a | b)"})
    lines = table.splitlines()
    assert lines[0] == "| name | what it does | measured gain | requirements |"
    assert len(lines) == 2 + len(OptimisedToy.optimisations)
    rows = {line.split(" | ")[0]: line for line in lines[2:]}
    assert rows["| `double-lr`"] == "| `double-lr` | twice the LR | 2x (a \\| b) | - |"
    assert rows["| `halve-lr`"] == "| `halve-lr` | half the LR |  | needs `double-lr` |"
    assert rows["| `scale-lr`"].endswith("|  | `=VALUE`, default `1.0` |")
    assert rows["| `no-bias`"].endswith("| not with `gpu-thing` |")
    assert rows["| `gpu-thing`"].endswith("| CUDA |")
    reg = Registry(Optimisation("one", "x", apply=lambda wl, v: None, single_process=True,
                                precisions=("amp-bf16", "amp-fp16")))
    assert markdown_table(reg).splitlines()[2] == \
        "| `one` | x |  | amp-bf16 or amp-fp16 only; one process |"
    with pytest.raises(SystemExit) as exc:
        parse(["--list-optimisations", "markdown"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == markdown_table(
        OptimisedToy.optimisations)
    with pytest.raises(SystemExit) as exc:
        parse(["--list-optimisations", "json"])
    assert exc.value.code == 2


def test_registry_refuses_a_requirement_registered_after_its_dependant():
    with pytest.raises(ValueError, match="must be registered before"):
        Registry(Optimisation("b", "x", requires=("a",), apply=lambda wl, v: None),
                 Optimisation("a", "x", apply=lambda wl, v: None))


def test_ablation_variants_drop_each_name_with_what_requires_it():
    v = ablation_variants(OptimisedToy.optimisations, ["double-lr", "halve-lr", "scale-lr=2"])
    assert v["plain"] == [] and v["config"] == ["double-lr", "halve-lr", "scale-lr=2"]
    assert v["config-minus-double-lr"] == ["scale-lr=2"]
    assert v["config-minus-halve-lr"] == ["double-lr", "scale-lr=2"]
    assert v["config-minus-scale-lr"] == ["double-lr", "halve-lr"]


def test_plus_variants_add_each_other_name_less_what_excludes_it():
    v = plus_variants(OptimisedToy.optimisations, ["double-lr", "no-bias"], leave_out=["compile"])
    assert v == {"config-plus-halve-lr": ["double-lr", "no-bias", "halve-lr"],
                 "config-plus-scale-lr": ["double-lr", "no-bias", "scale-lr"],
                 "config-plus-gpu-thing": ["double-lr", "gpu-thing"]}   # no-bias excludes it
    v = plus_variants(OptimisedToy.optimisations, ["double-lr", "gpu-thing"])
    assert v["config-plus-no-bias"] == ["double-lr", "no-bias"]   # it excludes gpu-thing
    v = plus_variants(OptimisedToy.optimisations, ["no-bias"])
    assert v["config-plus-halve-lr"] == ["no-bias", "double-lr", "halve-lr"]   # its requirement


def test_config_optimisations_reads_the_array(tmp_path, monkeypatch):
    import common.optimisations as o

    (tmp_path / "benchmarks" / "toy").mkdir(parents=True)
    (tmp_path / "benchmarks" / "toy" / "config_x.sh").write_text(
        "OPTIMISATIONS=(double-lr 'scale-lr=2')\nTRAIN_ARGS=(--lr 1)\n")
    monkeypatch.setattr(o, "REPO", tmp_path)
    assert config_optimisations("toy", "x") == ["double-lr", "scale-lr=2"]
    with pytest.raises(UserError, match="no config"):
        config_optimisations("toy", "y")
