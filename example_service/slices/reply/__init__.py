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
from .reactions import reactions
from .register import ReplyErasure, register
from .views import RepliesView

SLICE = SliceFragment(
    "reply",
    query=ReplyQuery,
    mutation=ReplyMutation,
    subscription=ReplySubscription,
    types=TYPES,
    projectors=[RepliesView],
    reactions=reactions(),
    erasure=ReplyErasure(),
    register=register,
)

__all__ = ["SLICE"]
