"""msgq: openpilot's pub/sub API on two transports (pubsub.py: ZMQ or openpilot's shared-memory queues) and camera
ringbuffers in shared memory (visionipc/)."""
from msgq.pubsub import (Context, IpcError, MultiplePublishersError, Poller, PubSocket, SubSocket, DEFAULT_SEGMENT, drain_sock_raw,
                         is_local, max_message, pub_sock, remove_stack, stack_location, sub_sock, tcp_port, transport)
from msgq.zmq import runtime_dir

__all__ = ["Context", "IpcError", "MultiplePublishersError", "Poller", "PubSocket", "SubSocket", "DEFAULT_SEGMENT",
           "drain_sock_raw", "is_local", "max_message", "pub_sock", "remove_stack", "runtime_dir", "stack_location", "sub_sock",
           "tcp_port", "transport"]
