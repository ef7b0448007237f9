"""`nn.LSTM` captured as eager PyTorch runs it on a CPU: one fused oneDNN op per layer.

Eager `nn.LSTM` on CPU float tensors runs each layer (and direction) as one
``aten.mkldnn_rnn_layer`` and, in backward, one ``aten.mkldnn_rnn_layer_backward``. Under
`aot_export_module`, torch's decomposition of ``aten.lstm`` picks that fused layer only
for inference (`torch._decomp.decompositions.select_one_layer_lstm_function`: an input
that requires grad disqualifies it) and otherwise unrolls one cell per time step, with
the input projection and its weight gradient repeated each step: a different algorithm,
a few hundred small ops where eager runs two, measured 1.3x eager's step on lstm-lm.

`fused_lstm_capture()` makes the training capture choose the fused layer under eager's
own conditions (oneDNN enabled, every tensor on the CPU in float32 or bfloat16, no
projections), with ``train=True`` so the forward keeps the workspace its backward
reads. Autograd then records oneDNN's backward op, so the joint graph holds per layer the
fused forward (kind F) and one backward that makes the input, state and weight gradients
together (kind B: out-of-order backprop cannot split an LSTM layer's backward, nor can
eager). The two bias gradients of a layer are equal: the second bias enters as
``bias_hh * 1.0`` so that its gradient is a node of its own (aot_export's signature
needs one output node per parameter gradient), which adds one tiny op each way and
changes no value.

It patches a private function of torch for the duration of the capture only; a torch
without it captures the unrolled cells as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

LSTM_MODE = 2  # oneDNN's rnn kind for LSTM (ideep::rnn_kind::LSTM), as torch's decomposition passes it
FUSED_LSTM_TARGETS = ("aten.mkldnn_rnn_layer.default", "aten.mkldnn_rnn_layer_backward.default")


def fused_layer_args(
    inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor,
    hx: torch.Tensor, cx: torch.Tensor, reverse: bool, has_biases: bool = True,
) -> tuple[object, ...]:
    """The positional arguments of ``aten.mkldnn_rnn_layer`` for one training LSTM layer of
    one direction: input [T, B, I], weights [4H, I] and [4H, H], biases [4H], states
    [1, B, H] (what capture traces, and calibration's sweep times)."""
    return (inp, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, [], LSTM_MODE, hx.size(2), 1, has_biases, False, False, True)


def fused_layer_applies(inp: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[Sequence[torch.Tensor]]) -> bool:
    """Whether eager PyTorch runs this LSTM as oneDNN layers: oneDNN on, every tensor on the
    CPU in float32 or bfloat16, and no projections (h and c of one width)."""
    if not torch._C._get_mkldnn_enabled():
        return False
    tensors = [inp, *hx, *(t for layer in params for t in layer)]
    if any(t.device.type != "cpu" or t.dtype not in (torch.float32, torch.bfloat16) for t in tensors):
        return False
    return bool(hx[0].size(-1) == hx[1].size(-1))


def fused_training_layer(
    inp: torch.Tensor, hidden: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
    reverse: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One LSTM layer (one direction) as oneDNN's fused op, kept for backward; the
    signature of torch's one-layer functions (`_rnn_helper` calls it per layer)."""
    w_ih, w_hh = params[0], params[1]
    if has_biases:
        b_ih, b_hh = params[2], params[3] * 1.0  # a gradient node of its own (module docstring)
    else:
        b_ih, b_hh = torch.zeros(w_ih.size(0)), torch.zeros(w_hh.size(0))
    hx, cx = hidden[0].unsqueeze(0).contiguous(), hidden[1].unsqueeze(0).contiguous()
    out = torch.ops.aten.mkldnn_rnn_layer.default(
        *fused_layer_args(inp.contiguous(), w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, has_biases)
    )
    return out[0], (out[1].squeeze(0), out[2].squeeze(0))


@contextlib.contextmanager
def fused_lstm_capture() -> Iterator[None]:
    """Within it, a traced training `nn.LSTM` uses the fused oneDNN layer where eager would."""
    try:
        from torch._decomp import decompositions
    except ImportError:  # pragma: no cover - every torch this project pins has it
        yield
        return
    original: Callable[..., Any] | None = getattr(decompositions, "select_one_layer_lstm_function", None)
    if original is None:  # pragma: no cover - a torch that moved it: capture unrolls, as before
        yield
        return

    def select(inp: torch.Tensor, hx: Any, params: Any) -> Callable[..., Any]:
        return fused_training_layer if fused_layer_applies(inp, hx, params) else original(inp, hx, params)

    decompositions.select_one_layer_lstm_function = select  # type: ignore[attr-defined]
    try:
        yield
    finally:
        decompositions.select_one_layer_lstm_function = original  # type: ignore[attr-defined]
