"""An elastic torch training script for kolorun's elastic launches (tests/test_kolorun_elastic.py),
after Horovod's test/integration/data/elastic_torch_main.py: a tiny float64 model trained on
deterministic batches sharded by rank, a TorchState committed after every batch, rank 0
logging one JSON line per epoch, and scheduled failures.

Every global batch has 12 rows (seeded by its index); rank r of n trains on rows r::n, so the
averaged gradient does not depend on the size (2, 3, 4 or 6 ranks) and a run's weights depend
only on the steps taken: a restore that lost or repeated a step would show.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch

import kolo.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--logfile", required=True, help="rank 0 appends one JSON line per epoch")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=5)
parser.add_argument("--epoch-wait", type=float, default=0.0)
parser.add_argument(
    "--until-size", type=int, default=0, help="after --epochs, go on until the job has this size"
)
parser.add_argument("--max-epochs", type=int, default=200)
parser.add_argument(
    "--kill-host", default="", help="the rank on this host SIGKILLs itself at --kill-at"
)
parser.add_argument("--kill-at", default="[1, 2]", help="[epoch, batch]")
parser.add_argument("--fail-host", default="", help="a rank started on this host exits 1 ...")
parser.add_argument("--fail-times", type=int, default=0, help="... this many times (counted in")
parser.add_argument("--fail-counter", default="", help="... this file)")
parser.add_argument(
    "--hosts-schedule",
    default="{}",
    help="JSON {epoch: hosts}: rank 0 waits for the host update before that epoch",
)
parser.add_argument("--save-restored", default="", help="rank 0 saves the first restored commit")
parser.add_argument("--resume-from", default="", help="start from a saved commit")
parser.add_argument("--weights", default="", help="rank 0 saves the final weights here")
args = parser.parse_args()

host = os.environ.get("HOROVOD_HOSTNAME", "")
start_rank = int(os.environ.get("HOROVOD_RANK", "0"))


def log(text: str) -> None:
    print(f"{time.time():.3f} {text}", flush=True)


if args.fail_host and host == args.fail_host and args.fail_counter:
    failed = 0
    if os.path.exists(args.fail_counter):
        failed = len(open(args.fail_counter).read().split())
    if failed < args.fail_times:
        with open(args.fail_counter, "a") as counter:
            counter.write("x\n")
        log(f"failing on purpose on {host} ({failed + 1} of {args.fail_times})")
        sys.exit(1)

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 3).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def batch_rows(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + index)
    data = torch.randn(12, 4, generator=generator, dtype=torch.float64)
    target = torch.randint(0, 3, (12,), generator=generator)
    return data[hvd.rank() :: hvd.size()], target[hvd.rank() :: hvd.size()]


state = hvd.elastic.TorchState(
    model, optimizer, epoch=0, batch=0, rendezvous=0, steps=0, sized_epochs=0
)
if args.resume_from:
    saved = torch.load(args.resume_from, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    state.epoch, state.batch, state.steps = saved["epoch"], saved["batch"], saved["steps"]
    state.commit()

schedule = {int(k): v for k, v in json.loads(args.hosts_schedule).items()}
resets = {"count": 0}


def on_reset() -> None:
    resets["count"] += 1
    log(f"reset {resets['count']}: rank {hvd.rank()} of {hvd.size()} at epoch {state.epoch} "
        f"batch {state.batch} (env HOROVOD_RANK={os.environ.get('HOROVOD_RANK')})")  # fmt: skip
    if args.save_restored and hvd.rank() == 0 and not os.path.exists(args.save_restored):
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": state.epoch,
                "batch": state.batch,
                "steps": state.steps,
            },
            args.save_restored,
        )


state.register_reset_callbacks([on_reset])
kill_at = tuple(json.loads(args.kill_at))


def done(state) -> bool:
    if state.epoch >= args.max_epochs:
        return True
    return state.epoch >= args.epochs and (args.until_size == 0 or state.sized_epochs > 0)


@hvd.elastic.run
def train(state) -> None:
    state.rendezvous += 1
    first_step = True
    while not done(state):
        while state.batch < args.batches_per_epoch:
            if host == args.kill_host and (state.epoch, state.batch) == kill_at:
                log(f"killing myself (rank {hvd.rank()} on {host})")
                os.kill(os.getpid(), signal.SIGKILL)
            data, target = batch_rows(state.epoch * args.batches_per_epoch + state.batch)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            if first_step:
                log(f"first step of rendezvous {state.rendezvous}: rank {hvd.rank()} of "
                    f"{hvd.size()}")  # fmt: skip
                first_step = False
            state.batch += 1
            state.steps += 1
            state.commit()
        if hvd.rank() == 0:
            with open(args.logfile, "a") as out:
                line = dict(epoch=state.epoch, size=hvd.size(), rank=hvd.rank(), host=host,
                            start_rank=start_rank, rendezvous=state.rendezvous,
                            env_rank=os.environ.get("HOROVOD_RANK"),
                            env_size=os.environ.get("HOROVOD_SIZE"))  # fmt: skip
                out.write(json.dumps(line) + "\n")
            upcoming = schedule.get(state.epoch + 1)
            if upcoming is not None and upcoming != schedule.get(state.epoch):
                # As Horovod's test script: wait for the driver's notice of the change.
                started = time.time()
                while state._host_messages.empty():
                    if time.time() - started > 20:
                        raise TimeoutError("no host update from the driver within 20 s")
                    time.sleep(0.05)
        if args.epoch_wait:
            time.sleep(args.epoch_wait)
        if args.until_size and hvd.size() >= args.until_size:
            state.sized_epochs += 1
        state.epoch += 1
        state.batch = 0
        state.commit()
    # Every rank leaves training together: a rank that returned and exited while another still
    # commits would fail that commit (its engine sees the peer go) and send it into a reset.
    hvd.allreduce(torch.zeros(1), name="train.end")


train(state)
if hvd.rank() == 0 and args.weights:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.weights)
log(f"done: rank {hvd.rank()} of {hvd.size()}, {state.steps} steps")
hvd.shutdown()
