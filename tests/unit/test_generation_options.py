"""`GenerationOptions`, written out field by field, is the options table's (`server/options.py`):
the same names in the same order, each with the table's type and default."""

from __future__ import annotations

import dataclasses
import typing

from server.engine.types import GenerationOptions
from server.options import KNOBS


def test_its_fields_are_the_tables_rows_in_order():
    assert [f.name for f in dataclasses.fields(GenerationOptions)] == [knob.name for knob in KNOBS]


def test_each_field_has_the_tables_type_and_default():
    hints = typing.get_type_hints(GenerationOptions)
    for field, knob in zip(dataclasses.fields(GenerationOptions), KNOBS, strict=True):
        assert hints[field.name] == knob.python_type, (field.name, hints[field.name], knob.python_type)
        assert field.default == knob.default and type(field.default) is type(knob.default), field.name
        assert field.default_factory is dataclasses.MISSING, field.name


def test_the_defaults_are_the_tables_and_frozen():
    options = GenerationOptions()
    assert {knob.name: getattr(options, knob.name) for knob in KNOBS} == {knob.name: knob.default for knob in KNOBS}
    assert dataclasses.is_dataclass(GenerationOptions) and GenerationOptions.__dataclass_params__.frozen
