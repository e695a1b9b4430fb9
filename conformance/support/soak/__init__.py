"""The soak harness: the reference service under a mixed load while things
fail, then every promise checked at once.

`run_soak` spawns ``pods`` processes of the reference service (the black-box
`Pods`) on one Postgres and one nats-server of its own (``sync_interval:
always``, so a SIGKILL loses nothing JetStream acknowledged), opens
``sessions`` live subscriptions over real WebSockets spread over ``cohorts``
orgs (half ``boards``, half ``cards``), and drives ``rate`` operations/s
mixed across the slices: GraphQL mutations over HTTP (board and card
renames, ledger postings, typing presence), ``card.create`` commands from
the twin over NATS, replies streamed on lane A by the twin and sealed by its
``reply.finish``, and poison commands the service must dead-letter. While it
runs, a fault schedule injects each kind ``faults`` times, one fault at a
time, waiting for recovery before the next:

* ``nats_kill``: nats-server SIGKILLed, held down past ``nats_grace``, restarted;
* ``listener_kill``: ``pg_terminate_backend`` of every pod's LISTEN backend;
* ``pod_kill``: one pod SIGKILLed mid-load and restarted (its sessions
  reconnect to the other pod and start again from a Reset);
* ``burst``: ``burst`` concurrent mutations at once, past the pods'
  ``listener_channel_capacity`` (set small for the pods);
* ``stall``: a subscriber that stops reading its socket for a while (its
  session must come back Reset or closed; the others are unaffected).

It stops by itself (``seconds`` of load, then a bounded drain) and the oracle
compares what every client saw with committed state. The result is a
`SoakReport`: the table `bench/soak.py` prints and the list of violations
the conformance scenario asserts empty.

The parts: `model` (configuration, GraphQL, records), `context` (the run's
shared state), `session` (one live subscription), `load`, `faults`,
`observe` (readiness samples and metrics), `oracle` (the checks of every
promise), `report` (the table), `run` (one run from start to finish).
"""

from .model import FAULT_KINDS, SoakConfig
from .report import SoakReport
from .run import run_soak

__all__ = ["FAULT_KINDS", "SoakConfig", "SoakReport", "run_soak"]
