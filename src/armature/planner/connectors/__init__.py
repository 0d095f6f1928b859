"""How the planner's decisions reach the fleet: the `Connector` contract (api.py) and its
implementations. Each makes a role's fleet a given size; a failure is a `ConnectorError`
that the planner service logs and retries.

    api.py      Connector, ConnectorError
    local.py    LocalConnector: `armature worker` processes on this host (ProcessLauncher seam)
    virtual.py  VirtualConnector: targets in discovery, acknowledged by an external orchestrator
    kubernetes.py  KubernetesConnector: a Deployment's replicas per role (lightkube, imported
                only when chosen: not exported here)
"""

from __future__ import annotations

from armature.planner.connectors.api import Connector, ConnectorError

__all__ = ["Connector", "ConnectorError"]
