"""The dense program's op allow list: what every model family exports is allowed, and nothing else; a program
holding any other op is refused before its parameters load."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from pathlib import Path

import paddle
import pytest

from components.config import ExportDtype
from components.data_prep.prepare import prepare_synthetic
from components.export.manifest import ServingModelError
from components.export.program import ALLOWED_OPS, PROGRAM_FILES, declared_ops, load_program, program_ops
from components.export.sharded import export_sharded
from components.export.single import export_single
from tests.export.checkpoints import CALIBRATION, VOCAB, commit_checkpoint, make_checkpoint

FAMILIES = ("dnn", "wide_deep", "deepfm", "dcn")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("program") / "data"
    prepare_synthetic(out, rows=300, test_fraction=0.25, num_shards=1, vocab_size=VOCAB, seed=7)
    return out


@pytest.fixture(scope="module")
def exported(data_dir, tmp_path_factory) -> dict[str, list[Path]]:
    """Per family, its exports in both formats with calibration and negative downsampling each on and off, and
    with float16 rows."""
    root = tmp_path_factory.mktemp("program-exports")
    out: dict[str, list[Path]] = {}
    for family, calibration, rate in itertools.product(FAMILIES, (None, CALIBRATION), (None, 0.25)):
        checkpoint = make_checkpoint(data_dir, family, seed=1)
        meta = {**checkpoint.meta, "calibration": calibration, "negative_sample_rate": rate}
        name = f"{family}-{calibration is not None}-{rate}"
        ckpt = commit_checkpoint(root / name, dataclasses.replace(checkpoint, meta=meta))
        single = export_single(ckpt, root / f"{name}-single")
        export_sharded(ckpt, str(root / f"{name}-store"))
        out.setdefault(family, []).extend([single, root / f"{name}-store" / "v000001"])
        if calibration is None and rate is None:  # the rows' dtype is independent of the network's options
            out[family].append(export_single(ckpt, root / f"{name}-single16", ExportDtype.float16))
            export_sharded(ckpt, str(root / f"{name}-store16"), ExportDtype.float16)
            out[family].append(root / f"{name}-store16" / "v000001")
    return out


def test_every_family_exports_only_allowed_ops_and_the_list_holds_nothing_they_do_not_use(exported):
    used = set()
    for family, dirs in exported.items():
        for directory in dirs:
            ops = program_ops(load_program(directory).program)
            assert ops <= ALLOWED_OPS, (family, directory.name, ops - ALLOWED_OPS)
            used |= ops
    assert used == ALLOWED_OPS  # an op no export writes does not belong in the list


def _copy_with_its_program(source, copy):
    """``source``'s export copied to ``copy``: ``(its parsed program, the global block, an activation's name)``."""
    shutil.copytree(source, copy)
    program = paddle.static.Program.parse_from_string((source / PROGRAM_FILES[0]).read_bytes())
    block = program.global_block()
    target = next(name for name in block.vars if not block.vars[name].persistable and name not in ("feed", "fetch"))
    return program, block, target


@pytest.mark.parametrize("op", ("save", "print"))
def test_a_program_holding_an_op_outside_the_list_is_refused_naming_it(exported, tmp_path, op):
    altered = tmp_path / "altered"
    program, block, target = _copy_with_its_program(exported["dnn"][0], altered)
    if op == "save":
        block.append_op(type="save", inputs={"X": [block.var(target)]}, outputs={},
                        attrs={"file_path": str(tmp_path / "leaked"), "overwrite": True})
    else:
        block.append_op(type="print", inputs={"In": [block.var(target)]}, outputs={"Out": [block.var(target)]},
                        attrs={"first_n": -1, "summarize": 20, "message": "", "print_tensor_name": True,
                               "print_tensor_type": True, "print_tensor_shape": True, "print_tensor_layout": True,
                               "print_tensor_lod": True, "print_phase": "BOTH", "is_forward": True})
    (altered / PROGRAM_FILES[0]).write_bytes(program.desc.serialize_to_string())
    with pytest.raises(ServingModelError) as refused:
        load_program(altered)
    message = str(refused.value)
    assert "\n" not in message and f"holds op(s) {op} that no export writes" in message
    assert str(altered / PROGRAM_FILES[0]) in message
    assert not (tmp_path / "leaked").exists()


def test_an_op_a_custom_network_declares_loads_and_only_where_declared(exported, tmp_path):
    extended = tmp_path / "extended"
    program, block, target = _copy_with_its_program(exported["dnn"][0], extended)
    block.append_op(type="tanh", inputs={"X": [block.var(target)]}, outputs={"Out": [block.var(target)]})
    (extended / PROGRAM_FILES[0]).write_bytes(program.desc.serialize_to_string())
    with pytest.raises(ServingModelError, match="holds op.s. tanh .*list them in model.extra_ops"):
        load_program(extended)
    assert "tanh" in program_ops(load_program(extended, extra_ops=["tanh"]).program)
    assert declared_ops({"model": {"name": "custom", "extra_ops": ["tanh"]}}) == ["tanh"]
    assert declared_ops({"model": {"name": "dnn"}}) == []
