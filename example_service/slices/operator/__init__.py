"""The operator slice: the service's operator gestures on its GraphQL
surface, gated by the ops role (the passport role that opens ``/ops``).
Today one: ``erasePerson``, the engine's erasure across every slice that
registered an `Erasable`.

Remove it by deleting this folder and its line in ``slices/__init__.py``:
it holds no data, registers nothing and brings no migration.
"""

from service_engine.graphql import SliceFragment

from .graphql import ErasePersonResult, OperatorMutation

SLICE = SliceFragment("operator", mutation=OperatorMutation, types=(ErasePersonResult,))

__all__ = ["SLICE"]
