"""What a dashboard server needs to know, from the broker's configuration or ``halfmq dashboard``'s flags."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DashboardSettings:
    namesrv: str  #: name servers ("host:port;host:port"), or a broker's own port: it answers routes too
    host: str = "127.0.0.1"
    port: int = 8080
    #: sign-in required: with ACL on the brokers, only their admin accounts may use the dashboard
    acl: bool = False
    #: seconds between samples of the brokers' figures for the charts (rates, pending halves, watched lags)
    sample_interval_s: float = 5.0
    history_samples: int = 720  #: kept per series: an hour at the default interval
    session_ttl_s: float = 3600.0
    request_timeout_s: float = 5.0

    @classmethod
    def from_broker_config(cls, cfg, namesrv: str) -> "DashboardSettings":
        """``dashboardBindAddress`` empty: loopback unless ACL is on (then the broker's bindAddress)."""
        host = cfg.dashboardBindAddress or (cfg.bindAddress if cfg.aclEnable else "127.0.0.1")
        return cls(namesrv=namesrv, host=host, port=cfg.dashboardPort, acl=cfg.aclEnable)
