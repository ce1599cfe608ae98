"""The standalone name server's configuration (``halfmq namesrv``): RocketMQ's namesrv key names, the same file
syntax and precedence as the broker's (defaults < ``-c`` file < ``HALFMQ_NAMESRV_<KEY>`` variables < flags).
Keys it shares with the broker (bounds on connections and frames, ACL, logging) are the broker's definitions."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import _doc, load_config, same_key


@dataclass(frozen=True)
class NamesrvConfig:
    listenPort: int = _doc("name server port (0 = any free port)", default=9876, meta={"min": 0, "max": 65535})
    bindAddress: str = same_key("bindAddress", doc="interface the name server listens on: 0.0.0.0 = every IPv4 "
                                                   "interface, :: = every IPv4 and IPv6 interface")
    scanNotActiveBrokerInterval: int = _doc("ms between scans that drop brokers whose registration is older than "
                                            "their timeout (brokerNotActiveTimeoutMillis, 120 s by default)",
                                            default=5000, meta={"min": 100})
    namesrvMaxBrokers: int = _doc("brokers a name server keeps at once; a registration of one more is refused",
                                  default=1024, meta={"min": 1})
    namesrvMaxTopicsPerBroker: int = _doc("topics one broker's registration may carry; a larger one is refused",
                                          default=100_000, meta={"min": 1})
    namesrvMaxTopicEntries: int = _doc("topics a name server keeps over all its brokers together (each broker's "
                                       "count once); a registration that would pass it is refused",
                                       default=1_000_000, meta={"min": 1})
    aclEnable: bool = same_key("aclEnable", doc="registrations (REGISTER_BROKER, UNREGISTER_BROKER) and "
                                                "DELETE_TOPIC_IN_NAMESRV need an admin account of aclConfigFile; "
                                                "when off, registrations are open and deletions are served to "
                                                "loopback clients only")
    aclConfigFile: str = same_key("aclConfigFile")
    serverMaxFrameSize: int = same_key("serverMaxFrameSize")
    serverMaxInflightPerConnection: int = same_key("serverMaxInflightPerConnection")
    serverMaxConnections: int = same_key("serverMaxConnections")
    serverChannelMaxIdleTimeSeconds: int = same_key("serverChannelMaxIdleTimeSeconds")
    serverMaxUnreadBytesPerConnection: int = same_key("serverMaxUnreadBytesPerConnection")
    serverMaxInflightBytesPerConnection: int = same_key("serverMaxInflightBytesPerConnection")
    serverMaxBufferedFrameBytes: int = same_key("serverMaxBufferedFrameBytes")
    serverBufferedFrameWaitSeconds: int = same_key("serverBufferedFrameWaitSeconds")
    logLevel: str = same_key("logLevel")


def load_namesrv_config(path: str | None, flags=(), environ=None) -> NamesrvConfig:
    """Raises ConfigError naming the bad key, as the broker's load_config."""
    return load_config(path, flags, environ, cls=NamesrvConfig, env_prefix="HALFMQ_NAMESRV_")
