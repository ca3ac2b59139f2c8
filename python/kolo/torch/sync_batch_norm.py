"""Horovod's ``SyncBatchNorm``: batch normalization with statistics over every rank's batch."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from kolo import _core
from kolo.torch._process_set_args import _process_set_included, _process_set_kwargs
from kolo.torch.ops import allgather, allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training-mode statistics cover the batches of all ranks.

    In training the per-channel mean and variance are computed over the concatenation of every
    rank's batch (ranks may have different batch sizes), and the backward pass reduces the
    gradient terms across ranks too, so forward and input gradients equal those of
    ``torch.nn.BatchNorm*d`` run on the concatenated batch. Parameter gradients are this rank's
    share (the :func:`DistributedOptimizer` averages them like any other). In eval mode, or with
    one rank, it is an ordinary batch norm. Accepts inputs of shape ``(N, C, ...)``.

    Example::

        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3), hvd.SyncBatchNorm(16), torch.nn.ReLU()
        )
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {input.dim()}D input")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalizes ``input`` with the statistics of all ranks' batches (in training).

        Example::

            bn = hvd.SyncBatchNorm(4)
            out = bn(torch.randn(8, 4))  # same as BatchNorm1d over all ranks' 8-row batches
        """
        self._check_input_dim(input)
        distributed = (
            self.training and _process_set_included(self.process_set) and self._group_size() > 1
        )
        if not distributed:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        return _SyncBatchNormFn.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.eps,
            factor,
            self.process_set,
        )

    def _group_size(self) -> int:
        return _core.size() if self.process_set is None else int(self.process_set.size())


def _channel_view(t: torch.Tensor, dims: int) -> torch.Tensor:
    return t.view(1, -1, *([1] * (dims - 2)))


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        input: torch.Tensor,
        weight: Optional[torch.Tensor],
        bias: Optional[torch.Tensor],
        running_mean: Optional[torch.Tensor],
        running_var: Optional[torch.Tensor],
        eps: float,
        factor: float,
        process_set: Any,
    ) -> torch.Tensor:
        channels = input.shape[1]
        compute = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        x = input.to(compute)
        reduce_dims = [0, *range(2, x.dim())]
        count = x.numel() // channels if channels else 0
        if count > 0:
            mean = x.mean(reduce_dims)
            var = x.var(reduce_dims, unbiased=False)
        else:
            mean = var = torch.zeros(channels, dtype=compute, device=x.device)
        # One row per rank: (count, mean, biased var); combined exactly (no sum of squares).
        local = torch.cat(
            [torch.tensor([count], dtype=torch.float64), mean.double().cpu(), var.double().cpu()]
        ).unsqueeze(0)
        rows = allgather(local, **_process_set_kwargs(process_set))
        counts, means, variances = rows[:, :1], rows[:, 1 : channels + 1], rows[:, channels + 1 :]
        total = float(counts.sum())
        if total == 0:
            raise ValueError("SyncBatchNorm got an empty batch on every rank")
        global_mean = (counts * means).sum(0) / total
        global_var = (counts * (variances + (means - global_mean) ** 2)).sum(0) / total
        if running_mean is not None and running_var is not None:
            unbiased = global_var * (total / (total - 1)) if total > 1 else global_var
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(global_mean.to(running_mean), alpha=factor)
                running_var.mul_(1 - factor).add_(unbiased.to(running_var), alpha=factor)

        mean_c = global_mean.to(device=x.device, dtype=compute)
        invstd = torch.rsqrt(global_var.to(device=x.device, dtype=compute) + eps)
        xhat = (x - _channel_view(mean_c, x.dim())) * _channel_view(invstd, x.dim())
        out = xhat
        if weight is not None:
            out = out * _channel_view(weight.to(compute), x.dim())
        if bias is not None:
            out = out + _channel_view(bias.to(compute), x.dim())
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total = total
        ctx.process_set = process_set
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        xhat, weight, invstd = ctx.saved_tensors
        dims = xhat.dim()
        channels = xhat.shape[1]
        reduce_dims = [0, *range(2, dims)]
        dy = grad_output.to(xhat.dtype)
        sum_dy = dy.sum(reduce_dims)
        sum_dy_xhat = (dy * xhat).sum(reduce_dims)
        # Every rank reduces, whether or not it needs the input gradient, so calls stay matched.
        sums = allreduce(
            torch.cat([sum_dy, sum_dy_xhat]),
            op=_core.Sum,
            **_process_set_kwargs(ctx.process_set),
        )
        mean_dy = sums[:channels] / ctx.total
        mean_dy_xhat = sums[channels:] / ctx.total
        grad_input = None
        if ctx.needs_input_grad[0]:
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            grad_input = _channel_view(scale, dims) * (
                dy - _channel_view(mean_dy, dims) - xhat * _channel_view(mean_dy_xhat, dims)
            )
            grad_input = grad_input.to(grad_output.dtype)
        grad_weight = sum_dy_xhat.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None
