"""The misuse catalogue (`tests/misuse/`): every mistake raises our error, of the exact class the
case names (a `lift.LiftError`, and Flax's class where Flax raises one for the same mistake),
with a message that names what is at fault and ends with the fix.

docs/errors.md is checked against the catalogue in tests/test_docs_errors.py.
"""
import pytest

import lift
from tests.misuse.catalogue import AREAS, CASES


def _param(case, known_gap=True):
  """``case`` as a parameter, a strict xfail where the case names a known gap of ours."""
  marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail and known_gap else []
  return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize('case', [_param(case) for case in CASES.values()])
def test_the_mistake_raises_our_error_naming_the_culprit_and_the_fix(case):
  assert issubclass(case.error, lift.LiftError), case.error
  with pytest.raises(Exception) as info:
    case.mistake()
  error, message = info.value, str(info.value)
  assert type(error) is case.error, f'{type(error).__module__}.{type(error).__name__}: {message}'
  assert isinstance(error, lift.LiftError)
  if case.flax_error is not None:
    assert isinstance(error, case.flax_error), type(error).__mro__
  missing = [fragment for fragment in case.fragments if fragment not in message]
  assert not missing, f'{missing} not in: {message}'
  fix = message.partition('Fix:')[2].strip()
  assert len(fix) > 10, f'no fix in: {message}'


FLAX_CASES = [case for case in CASES.values() if case.flax_mistake is not None]


@pytest.mark.parametrize('case', [_param(case, known_gap=False) for case in FLAX_CASES])
def test_flax_refuses_the_same_mistake_with_the_class_ours_derives_from(case):
  assert case.flax_error is not None
  with pytest.raises(case.flax_error):
    case.flax_mistake()


def test_the_catalogue_covers_every_area_with_at_least_80_mistakes():
  assert len(CASES) >= 80
  assert all(AREAS.values())
  assert len(FLAX_CASES) >= 20
