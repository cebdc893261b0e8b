"""msgq: pub/sub messaging (pubsub.py) and camera ringbuffers in shared memory (visionipc/)."""
from msgq.pubsub import (Context, IpcError, MultiplePublishersError, Poller, PubSocket, SubSocket, DEFAULT_MAX_SIZE,
                         drain_sock_raw, is_local, pub_sock, sub_sock, runtime_dir, tcp_port)

__all__ = ["Context", "IpcError", "MultiplePublishersError", "Poller", "PubSocket", "SubSocket", "DEFAULT_MAX_SIZE",
           "drain_sock_raw", "is_local", "pub_sock", "sub_sock", "runtime_dir", "tcp_port"]
