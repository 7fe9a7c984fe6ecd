"""The tagger's own transformer layers on ONNX Runtime, for encoders that run there.

Why: with an ONNX encoder (`onnx`, `onnx-int8`, the CPU default under `auto`) the encoder's int8 pass costs a
fraction of PyTorch's, and the tagger's copied top layers, left in fp32 PyTorch, became the larger part of
indexing (more than the whole encoder pass on 2 cores). So they are exported once to ONNX, quantised the way the
encoder's int8 graph is (dynamic int8, per output channel, matrix products only: `encode.onnx._quantize_onnx`),
cached beside the encoder's export (keyed by the tagger's weights), and run in a session of their own. They read
the encoder's own hidden states (the pass is still one); pooling and the BiLSTM stay in PyTorch (they are small)."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..encode.identity import EncoderBackendError
from ..encode.onnx import _quantize_onnx, _quiet
from .net import _torch

#: bump when the exported tagger graph changes (inputs, outputs, opset): cached exports are then redone
TAGGER_ONNX_FORMAT = 1


def _digest(net) -> str:
    torch = _torch()
    h = hashlib.sha256(f"{TAGGER_ONNX_FORMAT}|{torch.__version__}".encode())
    for name, t in sorted(net.layers.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


class OnnxTaggerLayers:
    """`(hidden (B, T, d) float tensor, valid (B, T) bool tensor) -> (B, T, d)`: the tagger's copied layers,
    run by ONNX Runtime (int8 when the encoder is), the same function as `TaggerNet`'s layers in PyTorch."""

    def __init__(self, net, folder: Path, *, int8: bool):
        import onnxruntime as ort

        folder = folder / f"tagger-{_digest(net)}"
        path = folder / ("layers-int8-matmul-per-channel.onnx" if int8 else "layers.onnx")
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            fp32 = folder / "layers.onnx"
            if not fp32.exists():
                _export_layers(net, fp32)
            if int8:
                _quantize_onnx(fp32, path)
        opts = ort.SessionOptions()
        # one thread, not spinning: the layers are small, and a second pool of threads fighting the encoder's
        # (which spin after each run) doubled indexing time on 2 cores (60 CSFCube abstracts, contended: tagging
        # added 93% to encoding with the torch thread count, 27% with one thread that does not spin)
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.path = path

    def __call__(self, hidden, valid):
        torch = _torch()
        feed = {"hidden": hidden.detach().float().cpu().contiguous().numpy(),
                "valid": valid.detach().cpu().numpy().astype(np.bool_)}
        return torch.from_numpy(self.session.run(["out"], feed)[0])


def _export_layers(net, path: Path) -> None:
    torch = _torch()

    class _Layers(torch.nn.Module):  # type: ignore[name-defined]  # torch, imported on first use
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, hidden, valid):
            for layer in self.layers:
                hidden = layer(hidden, valid)
            return hidden

    module = _Layers(net.layers).eval()
    dim = net.layers[0].query.in_features
    dummy = (torch.randn(2, 16, dim), torch.ones(2, 16, dtype=torch.bool))
    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    try:
        with _quiet(ignore_warnings=True), torch.inference_mode():
            torch.onnx.export(module, dummy, str(tmp), input_names=["hidden", "valid"], output_names=["out"],
                              dynamic_axes={"hidden": {0: "batch", 1: "tokens"}, "valid": {0: "batch", 1: "tokens"},
                                            "out": {0: "batch", 1: "tokens"}}, opset_version=17, dynamo=False)
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise EncoderBackendError(f"cannot export the tagger's layers to ONNX ({type(e).__name__}: {e}); "
                                  "use --encoder-backend torch") from e


def layers_for(net, encoder) -> OnnxTaggerLayers | None:
    """The ONNX copy of `net`'s layers for an encoder that runs on ONNX Runtime (None otherwise, or when the
    tagger copies no layers)."""
    runner_path = getattr(getattr(encoder, "_runner", None), "path", None)
    backend = str(getattr(encoder, "backend", ""))
    if not len(net.layers) or runner_path is None or not backend.startswith("onnx"):
        return None
    # beside the encoder's own export: <cache>/onnx/<encoder digest>/model*.onnx -> <cache>/onnx/tagger-<digest>/
    return OnnxTaggerLayers(net, Path(runner_path).parent.parent, int8=backend.endswith("int8"))
