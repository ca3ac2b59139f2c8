"""Elastic PyTorch Lightning training on kolo: a ``Trainer.fit`` through
:class:`~kolo.lightning.KoloStrategy` that survives ranks leaving and joining.

Horovod's Lightning integration has no elastic mode; this one follows Horovod's Keras design
(a state object, a commit callback, the ``run`` decorator around the fit), with Lightning's own
checkpoint as the committed state:

- :class:`LightningState` tracks a ``LightningModule``. A commit inside a fit takes the whole
  Lightning checkpoint (weights, optimizer and LR-scheduler states, the loops' progress,
  callback states) into host memory, the same dictionary ``Trainer.save_checkpoint`` writes,
  without writing a file. Before the first such commit the committed state is the module's
  weights.
- :class:`CommitStateCallback` commits at the end of every training epoch (so a resumed fit
  starts at an epoch boundary and Lightning's sampler re-splits whole epochs among the new
  ranks).
- :func:`run` (:func:`kolo.elastic.run`) wraps a function that builds a ``Trainer`` and calls
  ``trainer.fit(state.model, ..., ckpt_path=state.ckpt_path)``. When a rank fails, the fit
  raises the failed collective's ``HorovodInternalError``; the survivors restore the commit,
  reset (``shutdown()`` + ``init()``), sync rank 0's commit and call the function again, whose
  fresh ``Trainer`` resumes from the committed checkpoint on the new number of ranks and runs
  to ``max_epochs``. A host added or removed interrupts at the next epoch-end commit
  (``HostsUpdatedInterrupt``) and the fit resumes in the same way.

``state.ckpt_path`` is a :class:`CommittedCheckpoint`: a ``str`` that names no file and that
``KoloStrategy.load_checkpoint`` resolves to the committed checkpoint (so it only works with
``KoloStrategy``); it is ``None`` until a fit committed.

Example::

    import lightning.pytorch as pl
    import kolo.torch as hvd
    from kolo.lightning import KoloStrategy, elastic

    hvd.init()
    state = elastic.LightningState(model)

    @elastic.run
    def train(state):
        trainer = pl.Trainer(
            strategy=KoloStrategy(), accelerator="cpu", devices=1, max_epochs=10,
            callbacks=[elastic.CommitStateCallback(state)],
        )
        trainer.fit(state.model, train_loader, ckpt_path=state.ckpt_path)

    train(state)
"""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl

from kolo import _core
from kolo.elastic import ObjectState, run
from kolo.torch._objects import broadcast_object
from kolo.torch.elastic.state import host_copy

__all__ = ["CommitStateCallback", "CommittedCheckpoint", "LightningState", "run"]


class CommittedCheckpoint(str):
    """The ``ckpt_path`` that resumes a fit from a :class:`LightningState`'s last commit.

    A ``str`` (Lightning passes ``ckpt_path`` around as one) naming no file:
    ``KoloStrategy.load_checkpoint`` recognizes it and returns a copy of the committed
    checkpoint instead of reading a file.

    Example::

        trainer.fit(state.model, loader, ckpt_path=state.ckpt_path)
    """

    state: LightningState

    def __new__(cls, state: LightningState) -> CommittedCheckpoint:
        """The path of ``state``'s last commit (its text says how many epochs it holds)."""
        path = super().__new__(cls, f"<kolo elastic commit: {state.epoch} epoch(s) done>")
        path.state = state
        return path

    def load(self) -> dict[str, Any]:
        """A copy of the committed checkpoint (the fit may change what it is given in place:
        the commit must stay as it is for the next restore).

        Example::

            checkpoint = state.ckpt_path.load()
        """
        checkpoint = self.state._checkpoint
        if checkpoint is None:
            raise ValueError("this LightningState has no committed checkpoint to resume from")
        return host_copy(checkpoint)


class LightningState(ObjectState):
    """The state of an elastic Lightning fit: a ``LightningModule`` and, once a fit
    committed, Lightning's full checkpoint of that fit, kept in host memory; plus plain
    attributes as in :class:`~kolo.elastic.ObjectState`. ``epoch`` (default 0) is the number
    of training epochs completed at the last commit.

    Args:
        model: the ``LightningModule`` (the same object is fitted again after a reset).
        kwargs: further attributes to track.

    Example::

        state = kolo.lightning.elastic.LightningState(model)
        print(state.epoch, state.ckpt_path)   # 0 None
    """

    def __init__(self, model: pl.LightningModule, **kwargs: Any) -> None:
        kwargs.setdefault("epoch", 0)
        self.model = model
        #: The Trainer whose fit is running (set by CommitStateCallback), or None.
        self.trainer: Optional[pl.Trainer] = None
        self._checkpoint: Optional[dict[str, Any]] = None
        self._model_state = host_copy(model.state_dict())
        super().__init__(bcast_object=broadcast_object, get_rank=_core.rank, **kwargs)

    @property
    def ckpt_path(self) -> Optional[CommittedCheckpoint]:
        """What to pass as ``Trainer.fit(ckpt_path=...)``: the last commit, or ``None`` when
        no fit has committed yet (the fit then starts from the module as it is).

        Example::

            trainer.fit(state.model, loader, ckpt_path=state.ckpt_path)
        """
        return None if self._checkpoint is None else CommittedCheckpoint(self)

    def save(self) -> None:
        """Commits: inside a fit, Lightning's checkpoint of it (``dump_checkpoint``, as
        ``Trainer.save_checkpoint`` writes it) copied to host memory, reusing the previous
        commit's buffers; outside one, the module's weights. Then the attributes."""
        trainer = self.trainer
        if trainer is not None:
            # The dictionary Trainer.save_checkpoint writes, without the file.
            dumped = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            self._checkpoint = host_copy(dumped, self._checkpoint)
            self._model_state = self._checkpoint["state_dict"]
        else:
            self._model_state = host_copy(self.model.state_dict(), self._model_state)
        super().save()

    def restore(self) -> None:
        """Puts the committed weights back into the module and the attributes back; the next
        fit resumes the rest (optimizers, loops) from :attr:`ckpt_path`."""
        self.model.load_state_dict(self._model_state)
        super().restore()

    def sync(self) -> None:
        """Makes rank 0's commit every rank's (a joining rank has none) and loads its weights
        into the module."""
        self._model_state, self._checkpoint = self._bcast_object(
            (self._model_state, self._checkpoint)
        )
        self.model.load_state_dict(self._model_state)
        super().sync()

    def reset(self) -> None:
        """After a reset: forgets the interrupted fit's Trainer (the next fit builds its own)."""
        self.trainer = None


class CommitStateCallback(pl.Callback):
    """Commits ``state`` at the end of every training epoch of the fit (and tells the state
    which Trainer to checkpoint).

    Args:
        state: the :class:`LightningState` of the fit.

    Example::

        trainer = pl.Trainer(strategy=KoloStrategy(), max_epochs=5,
                             callbacks=[kolo.lightning.elastic.CommitStateCallback(state)])
    """

    def __init__(self, state: LightningState) -> None:
        super().__init__()
        self.state = state

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Points the state at this Trainer while it fits."""
        if stage == "fit":
            self.state.trainer = trainer

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Records the epochs completed and commits (which may raise
        ``HostsUpdatedInterrupt`` on every rank)."""
        self.state.epoch = trainer.current_epoch + 1
        self.state.commit()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The fit is over: later commits take the module's weights only."""
        if self.state.trainer is trainer:
            self.state.trainer = None
