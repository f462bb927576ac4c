"""The control plane's half of fault injection (tests and game days; off by default).

`FaultParams` (the DAG's `fault_*` Params) name two faults the training processes cannot inject
themselves; both apply to attempt 0 only, like the worker's (`FaultParams.worker_faults`):

- `fail_gpu_node` — right after the gang starts, mark GPU 0 of that node failed (Xid 79)
  through its node agent's test-only fault API (`POST /faults`; the agent must run with
  `--enable-fault-injection`). `gang` names the attempt's first node. The health watcher then
  sees the fatal verdict like a real one: it stops the gang with `node_lost`, the node is
  cordoned and the next placement leaves it out. The injected fault holds until
  `DELETE /faults` (a real failed GPU stays failed too).
- `corrupt_newest_checkpoint` — when the attempt has ended, before it is classified, overwrite
  the first bytes of one shard of the run's newest committed checkpoint (same size: only the
  file hash can tell). The decision that follows must not restore it: it re-hashes, quarantines
  it (kept) and restarts from the previous valid one, with the reason.

Both are idempotent, so a retried Airflow task does not undo or double them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.plugins.recovery.model import AttemptConf

log = logging.getLogger(__name__)

GANG = "gang"
"""`fail_gpu_node: gang` — the first node of the attempt's placement."""

CORRUPTION = b"trainyard-fault!"
"""What the corrupted shard starts with (the same bytes every time: idempotent)."""


class FaultNotApplied(FatalError):
    """A fault the trigger asked for cannot be carried out (no agent URL for the node, the agent
    refuses fault injection, no checkpoint to corrupt)."""


def fail_gpu(conf: AttemptConf, gang_nodes: list[str], agents: dict[str, str]) -> str | None:
    """Carry out `fail_gpu_node` for attempt 0; the node failed, or None when not asked."""
    wanted = conf.faults.fail_gpu_node.strip()
    if conf.attempt != 0 or not wanted:
        return None
    node = gang_nodes[0] if wanted == GANG and gang_nodes else wanted
    url = agents.get(node)
    if not url:
        raise FaultNotApplied(f"fault fail_gpu_node={wanted!r}: no node agent URL for {node!r} in "
                              f"TRAINYARD_NODE_AGENTS (known: {sorted(agents) or 'none'})")
    from trainyard.node_agent.client import AgentResponseError, AgentUnreachable, inject_fault
    from trainyard.node_agent.models import FaultRequest

    try:
        inject_fault(url, FaultRequest(gpu=0, xid=79, reason="fault injection: fail_gpu_node"))
    except (AgentResponseError, AgentUnreachable) as e:
        raise FaultNotApplied(f"fault fail_gpu_node={node!r}: the agent at {url} did not take it ({e}); "
                              "start it with --enable-fault-injection") from e
    log.warning("fault injection: GPU 0 of %s marked failed (Xid 79) through %s", node, url)
    return node


def corrupt_newest_checkpoint(conf: AttemptConf, checkpoint_root: str, *,
                              endpoint_url: str | None = None) -> str | None:
    """Carry out `corrupt_newest_checkpoint` for attempt 0: the corrupted shard's URI, or None
    when not asked. Overwrites, never deletes: the checkpoint stays committed (and wrong)."""
    if conf.attempt != 0 or not conf.faults.corrupt_newest_checkpoint:
        return None
    from trainyard.plugins.checkpoint.catalog import list_checkpoints
    from trainyard.plugins.storage.store import open_store

    committed = list_checkpoints(checkpoint_root, endpoint_url=endpoint_url)
    if not committed:
        raise FaultNotApplied(f"fault corrupt_newest_checkpoint: run {conf.run} committed no checkpoint "
                              f"under {checkpoint_root} (inject a later failure, or checkpoint more often)")
    newest = committed[-1]
    store = open_store(checkpoint_root, endpoint_url=endpoint_url)
    shard = max((f for f in newest.manifest.files if f.size >= len(CORRUPTION)), key=lambda f: f.size,
                default=None)
    if shard is None:
        raise FaultNotApplied(f"fault corrupt_newest_checkpoint: step {newest.step} has no file of "
                              f"{len(CORRUPTION)} bytes or more to corrupt")
    key = f"{newest.folder}/{shard.path}"
    data = store.get_bytes(key)
    store.put_bytes(key, CORRUPTION + data[len(CORRUPTION):])
    log.warning("fault injection: corrupted %s of checkpoint step %d (same size, wrong bytes)",
                shard.path, newest.step)
    return store.key_uri(key)
