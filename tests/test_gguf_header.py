import os

import pytest

from specli.errors import SpecliError
from specli.resolve.gguf_header import TensorInfo, read_gguf


def test_header_of_a_tiny_model(tiny_target):
    h = read_gguf(tiny_target)
    assert h.architecture == "llama"
    assert h.arch_key("block_count") == 2
    assert h.expected_size == os.path.getsize(tiny_target)
    names = {t.name for t in h.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert h.n_params > 49152 * 64 * 2


def test_truncated_in_the_data(tmp_path, tiny_target):
    data = open(tiny_target, "rb").read()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: len(data) - 1000])
    with pytest.raises(SpecliError, match=r"truncated GGUF file \(.* bytes, its tensors need"):
        read_gguf(p)


def test_truncated_in_the_header(tmp_path, tiny_target):
    p = tmp_path / "cut.gguf"
    p.write_bytes(open(tiny_target, "rb").read(5000))
    with pytest.raises(SpecliError, match="truncated GGUF file"):
        read_gguf(p)


def test_not_gguf_missing_and_directory(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("hello world")
    with pytest.raises(SpecliError, match="not a GGUF file"):
        read_gguf(p)
    with pytest.raises(SpecliError, match="model file not found"):
        read_gguf(tmp_path / "missing.gguf")
    with pytest.raises(SpecliError, match="is a directory"):
        read_gguf(tmp_path)


def test_tensor_sizes_come_from_the_gguf_package():
    """Every type llama.cpp's gguf package knows has its size (a hand-written table lacked the
    newer ones and counted them as 0 bytes); a type it does not know has none."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    sizes = {GGMLQuantizationType(t).name: TensorInfo("x", (block * 4, 3), int(t), 0).nbytes
             for t, (block, _) in GGML_QUANT_SIZES.items()}
    assert sizes == {GGMLQuantizationType(t).name: 12 * size for t, (_, size) in GGML_QUANT_SIZES.items()}
    assert TensorInfo("x", (256,), int(GGMLQuantizationType.Q4_K), 0).type_name == "Q4_K"
    unknown = TensorInfo("x", (256,), 9999, 0)
    assert unknown.nbytes is None and unknown.type_name == "9999"
