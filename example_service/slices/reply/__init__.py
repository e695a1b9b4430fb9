"""The reply slice: an accumulated reply streamed in chunks on the engine's
lane A (``stream.{service}.{reply_id}``) and sealed against its hash by a
reply-finished command (a NATS command reaction); cancel-in-flight
(``seal_current``); who is typing (a presence lane). A finish the seal
cannot honour is answered with ``reply.seal_failed`` so the producer resends
a corrected one.

Remove it by deleting this folder and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .graphql import TYPES, ReplyMutation, ReplyQuery, ReplySubscription
from .register import register

SLICE = SliceFragment(
    "reply",
    query=ReplyQuery,
    mutation=ReplyMutation,
    subscription=ReplySubscription,
    types=TYPES,
    register=register,
)

__all__ = ["SLICE"]
