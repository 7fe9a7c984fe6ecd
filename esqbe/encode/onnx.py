"""The ONNX Runtime encoder backend: the model exported once to ONNX (cached by its weights), fused, optionally
quantised to int8, and run by an InferenceSession. The exporters' chatter is silenced for the length of each step
by filters on their own loggers, never by a process-wide logging switch."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .identity import EncoderBackendError

#: bump when the exported ONNX graph changes (inputs, outputs, opset): cached exports are then redone
ONNX_EXPORT_FORMAT = 1


#: the loggers the export, the fusion and the quantisation report through (their own children included)
_EXPORT_LOGGERS = ("transformers", "torch.onnx", "onnxruntime", "onnx")


class _OnlyErrors(logging.Filter):
    """Drops what `logging.disable(logging.WARNING)` used to: warnings and below."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING


class _TheirRootRecords(logging.Filter):
    """On the root logger: drops warnings and below that the exporting libraries' own code logs through the root
    logger itself (`logging.warning(...)`, as onnxruntime's `quantize_dynamic` does for "Please consider to run
    pre-processing before quantization"), which no filter on their named loggers sees. Records of any other
    code pass."""

    _ROOTS = tuple(os.sep + n + os.sep for n in ("onnxruntime", "onnx", "transformers", "torch"))

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not any(r in record.pathname for r in self._ROOTS)


@contextmanager
def _quiet(*, ignore_warnings: bool = False):
    """For the length of the block, the exporting libraries' loggers (and their existing children) drop warnings
    and below, and so does the root logger for what their code logs through it; the filters come off afterwards,
    so levels, handlers and `logging.disable` stay the host's. A host without root handlers gets none: for the
    block a NullHandler stands there, so that `logging.warning` does not run `basicConfig` (which would install a
    stderr handler for the rest of the process)."""
    flt = _OnlyErrors()
    loggers = [logging.getLogger(n) for n in _EXPORT_LOGGERS]
    loggers += [lg for name, lg in list(logging.root.manager.loggerDict.items())
                if isinstance(lg, logging.Logger) and name.startswith(tuple(n + "." for n in _EXPORT_LOGGERS))]
    root, root_flt = logging.getLogger(), _TheirRootRecords()
    stand_in = logging.NullHandler() if not root.handlers else None
    with warnings.catch_warnings():
        if ignore_warnings:
            warnings.simplefilter("ignore")
        for lg in loggers:
            lg.addFilter(flt)
        root.addFilter(root_flt)
        if stand_in is not None:
            root.addHandler(stand_in)
        try:
            yield
        finally:
            for lg in loggers:
                lg.removeFilter(flt)
            root.removeFilter(root_flt)
            if stand_in is not None:
                root.removeHandler(stand_in)


def _cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where exports are kept: `cache_dir` (a ModelSpec's), else $ESQBE_CACHE_DIR, else ~/.cache/esqbe (read now)."""
    if cache_dir is not None:
        return Path(cache_dir) / "onnx"
    root = os.environ.get("ESQBE_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "esqbe")
    return Path(root) / "onnx"


def _weights_digest(config, fingerprint: str | None = None, model=None) -> str:
    """What the exported graph depends on: the model's identity (its fingerprint, `identity.fingerprint_dir`, which
    covers config, tokenizer and weights: whatever else joins the identity joins the key) or, without one (a hub
    model outside the cache), the weights themselves; and the exporter. The runtime and quantisation are the file's
    name inside the folder (`OnnxRunner.path`). `model`: the weights, read only without a fingerprint."""
    import hashlib

    import torch

    h = hashlib.sha256(f"{ONNX_EXPORT_FORMAT}|{torch.__version__}|{config.to_json_string()}".encode())
    if fingerprint:
        h.update(f"|{fingerprint}".encode())
        return h.hexdigest()[:20]
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


class OnnxRunner:
    """ONNX Runtime (CPU): the model exported once to ONNX (cached, keyed by its weights) with every hidden
    state as an output; `int8`: ONNX Runtime's dynamic quantisation (int8 weights, uint8 activations: VNNI).
    `model()` returns the PyTorch model: called only to export (or, without a fingerprint, to key the export)."""

    def __init__(self, model, config, source: str, *, int8: bool = False, cache_dir: str | None = None, offline: bool = False,
                 fingerprint: str | None = None, announce=None):
        import onnxruntime as ort
        import torch

        self.torch = torch
        self.num_layers = int(config.num_hidden_layers)
        folder = _cache_dir(cache_dir) / _weights_digest(config, fingerprint, None if fingerprint else model())
        path = folder / ("model-fused-int8-matmul-per-channel.onnx" if int8 else "model-fused.onnx")
        if not path.exists():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:  # a read-only home: build it under the temp directory instead
                import tempfile

                folder = Path(tempfile.gettempdir()) / f"esqbe-onnx-{os.getuid()}" / folder.name
                path = folder / path.name
                folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            if announce is not None:  # the first run's export takes a while: say what and where
                announce(f"exporting the model to ONNX{' and quantising it to int8' if int8 else ''} (once: "
                         f"about a minute), cached in {folder}")
            exported = folder / "model.onnx"
            if not exported.exists():
                _export_onnx(source, model(), exported, offline=offline)
            fused = folder / "model-fused.onnx"
            if not fused.exists():
                _fuse_onnx(exported, fused, config)
            if int8:
                _quantize_onnx(fused, path)
        self._ort = ort
        self._threads = max(1, torch.get_num_threads())
        #: rows the encoder may run at once, each on a one-thread session (`run_one`); 1: one multi-thread session
        self.workers = self._threads
        self._sessions: dict[int, object] = {}
        self._lock = threading.Lock()
        self.path = path
        self.inputs: list[str] = []
        self.outputs: list[str] = []


    def _session(self, threads: int):
        """The session with `threads` intra-op threads (made on first use: indexing needs only the one-thread one,
        a query only the multi-thread one)."""
        session = self._sessions.get(threads)
        if session is None:
            with self._lock:
                session = self._sessions.get(threads)
                if session is None:
                    ort = self._ort
                    opts = ort.SessionOptions()
                    opts.intra_op_num_threads = threads
                    opts.inter_op_num_threads = 1
                    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                    opts.log_severity_level = 3
                    # no spin-waiting between runs: spinning threads took the cores from the tokenizer and the
                    # pooling between two runs (on 2 cores, end to end)
                    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                    session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
                    self.inputs = [i.name for i in session.get_inputs()]
                    self.outputs = [o.name for o in session.get_outputs()]
                    self._sessions[threads] = session
        return session

    @property
    def session(self):
        """The multi-thread session (one call at a time: a query, a serial batch loop)."""
        return self._session(self._threads)

    def __call__(self, enc, hidden_states: bool):
        return self._run(self.session, enc, hidden_states)

    def run_one(self, enc, hidden_states: bool):
        """The same as a call, on the one-thread session: for `workers` calls at once from as many threads (the
        encoder's batches of one row while indexing). On 2 cores two one-thread runs side by side did more rows per
        second than one two-thread run: a batch of one row is too small for an op's work to be split well.
        The vectors are the same: each row is computed alone either way."""
        return self._run(self._session(1), enc, hidden_states)

    def _run(self, session, enc, hidden_states: bool):
        torch = self.torch  # (self.inputs / outputs are set: `session` was made first)
        feed = {k: enc[k].cpu().numpy() for k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in enc:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        names = self.outputs if hidden_states else self.outputs[-1:]
        out = [torch.from_numpy(x) for x in session.run(names, feed)]
        return out[-1], (tuple(out) if hidden_states else None)


def _export_onnx(source: str, model, path: Path, *, offline: bool = False) -> None:
    """torch.onnx (TorchScript exporter) of an eager-attention copy: outputs hidden_0 (embeddings) .. hidden_L."""
    import tempfile

    import torch

    from .modeldir import pretrained

    eager = pretrained("model", source, offline=offline or Path(source).is_dir() or "/" not in source,
                       attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())  # the weights the runner was keyed by (an adapter merged in), not the files'
    import inspect

    accepted = set(inspect.signature(eager.forward).parameters)
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]

    class _AllStates(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return tuple(self.m(**dict(zip(inputs, args)), output_hidden_states=True).hidden_states)

    names = [f"hidden_{i}" for i in range(int(model.config.num_hidden_layers) + 1)]
    dummy = tuple(torch.ones((2, 16), dtype=torch.long) for _ in inputs)
    axes = {n: {0: "batch", 1: "tokens"} for n in inputs + names}
    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    try:
        with _quiet(ignore_warnings=True):
            torch.onnx.export(_AllStates(eager), dummy, str(tmp), input_names=inputs, output_names=names,
                              dynamic_axes=axes, opset_version=17, dynamo=False)
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise EncoderBackendError(f"cannot export the model to ONNX ({type(e).__name__}: {e}); "
                                  "use --encoder-backend torch") from e


def _fuse_onnx(exported: Path, path: Path, config) -> None:
    """ONNX Runtime's transformer fusions (one Attention op per layer, SkipLayerNorm, BiasGelu) for BERT-style
    models; other architectures (or a failed fusion) keep the exported graph."""
    import tempfile

    if getattr(config, "model_type", "") not in ("bert", "roberta", "xlm-roberta"):
        shutil.copyfile(exported, path)
        return
    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    try:
        from onnxruntime.transformers.optimizer import (
            optimize_model,  # imported first: its loggers exist to be quieted
        )

        with _quiet():
            optimized = optimize_model(str(exported), model_type="bert", num_heads=int(config.num_attention_heads),
                                       hidden_size=int(config.hidden_size))
            optimized.save_model_to_file(str(tmp))
        os.replace(tmp, path)
    except Exception:  # an unfused graph runs the same, a little slower
        shutil.copyfile(exported, path)
    finally:
        tmp.unlink(missing_ok=True)


def _quantize_onnx(fp32: Path, path: Path) -> None:
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = Path(tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")[1])
    try:
        with _quiet():
            # per output channel weight scales: per-tensor ones cost ~6% cosine to the fp32 vectors, per channel <1%
            # the matrix products only: the embedding lookups (Gather) cost nothing and stay fp32
            quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul", "Attention"],
                             extra_options={"DefaultTensorType": 1})  # float, for the fused ops' outputs
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
