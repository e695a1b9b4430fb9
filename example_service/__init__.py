"""The reference service: a complete, bootable service built only on the
public surface of `service_engine`.

* `kernel` — the principal, its generic facts bag, the error base and the
  wire shapes every slice shares; it names no slice;
* `slices` — one folder per slice, listed once in `slices/__init__.py`;
* `register` / `graphql` — slice-agnostic: they register and serve whatever
  `slices` composes;
* ``python -m example_service`` — runs it (embedded infrastructure by default).
"""
