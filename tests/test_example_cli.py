"""The command lines of the example scripts: every flag has a help text, and a mistake in the
flags ends the script with one line on stderr that names the flag and the flag to pass (exit
status 2, no traceback), before anything is compiled or written."""
import importlib
import importlib.util
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / 'examples'
SCRIPTS = ('train_lm', 'train_lm_at_scale', 'causal_lm')
PARSERS = {'train_lm': 'train_lm_flags'}  # where a script's build_parser lives, if not in it
TINY_JOB = ['--digits', '1', '--depth', '4', '--batch', '16', '--steps', '8', '--warmup', '2']


def load(name):
  """The example script ``name`` as a module (its ``__main__`` block not run)."""
  if name in sys.modules:
    return sys.modules[name]
  if str(EXAMPLES) not in sys.path:  # the scripts import their sibling modules
    sys.path.insert(0, str(EXAMPLES))
  spec = importlib.util.spec_from_file_location(name, EXAMPLES / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('name', SCRIPTS)
def test_every_flag_has_a_help_text_and_the_description_is_a_sentence(name):
  parser = load(PARSERS.get(name, name)).build_parser()
  description = parser.description or ''
  assert description[:1].isupper() and description.endswith('.'), description
  assert len(description.split()) >= 8, description
  missing = [action.option_strings or action.dest for action in parser._actions
             if not (action.help or '').strip()]
  assert not missing, f'{name}: flags without help: {missing}'


def one_line_error(capsys, main, argv):
  """Runs ``main(argv)``, which must exit with status 2; returns its one line on stderr."""
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  captured = capsys.readouterr()
  assert exit_info.value.code == 2, (exit_info.value.code, captured.err)
  lines = captured.err.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), captured.err
  assert 'Traceback' not in captured.err
  return lines[0]


def test_an_unknown_topology_names_the_flag_and_a_known_one(capsys):
  line = one_line_error(capsys, load('train_lm_at_scale').main, ['--compile-for', 'v5e-100'])
  assert line.startswith("error: --compile-for v5e-100: unknown TPU topology"), line
  assert 'Fix: --compile-for v5e-128 (known: v5e-4, v5e-8,' in line, line
  assert 'nn.tpu_topology' not in line


def test_a_mesh_that_does_not_fill_the_chips_is_blamed_before_the_microbatches(capsys):
  line = one_line_error(capsys, load('train_lm_at_scale').main,
                        ['--compile-for', 'v5e-128', '--mesh', 'data=3,model=3'])
  assert line.startswith('error: --mesh data=3,model=3: 3 x 3 = 9 chips'), line
  assert 'v5e-128 has 128' in line and 'Fix: --mesh data=128' in line, line
  assert 'microbatch' not in line


def test_an_unknown_mesh_axis_is_named_with_the_known_ones(capsys):
  line = one_line_error(capsys, load('train_lm_at_scale').main,
                        ['--compile-for', 'v5e-128', '--mesh', 'data=128,foo=1'])
  assert "unknown axis 'foo'" in line and 'stage, data, model' in line, line


@pytest.mark.parametrize('flags, expected', [
    (['--pipeline-stages', '3'],
     '--pipeline-stages 3: the stages do not divide the 4 chips. Fix: --pipeline-stages 1, 2 '
     'or 4.'),
    (['--num-slices', '2', '--mesh', 'data=4'],
     '--mesh data=4: 4 chips, but v5e-4 x 2 slices has 8 chips. Fix: --mesh data=8'),
    (['--pipeline-stages', '2', '--mesh', 'data=4'],
     '--mesh data=4: stage=1, but --pipeline-stages 2 spreads its stages over a stage axis '
     'of 2. Fix: --mesh stage=2,data=2.'),
    (['--pipeline-stages', '2', '--microbatches', '3', '--mesh', 'stage=2,data=2'],
     '--microbatches 3: the 4 sequences of a step (--per-device-batch 1 x 4 chips) do not '
     'split into 3 microbatches that divide over data=2. Fix: --microbatches 1 or 2,'),
    (['--plan', '--mesh', 'data=4'], '--mesh data=4 with --plan: the plan chooses the mesh.'),
    (['--seq-length', '0'], 'argument --seq-length: 0 is not at least 1'),
    (['--model', 'llama9'], "argument --model: invalid choice: 'llama9'"),
])
def test_flags_that_do_not_fit_the_chips_or_each_other(capsys, flags, expected):
  line = one_line_error(capsys, load('train_lm_at_scale').main,
                        ['--compile-for', 'v5e-4', *flags])
  assert line.startswith(f'error: {expected}'), line


def test_libtpu_missing_is_one_line_with_its_pip_fix(capsys, monkeypatch):
  from linen_ext.scale import topology
  monkeypatch.setattr(topology, '_libtpu_present', lambda: False)
  line = one_line_error(capsys, load('train_lm_at_scale').main, ['--compile-for', 'v5e-4'])
  assert line.startswith('error: --compile-for v5e-4: compiling for v5e-4 needs libtpu'), line
  assert "Fix: pip install 'libtpu" in line, line


def test_a_mesh_stage_axis_must_be_the_pipelines():
  job = load('train_lm')
  args = job.parse_args(TINY_JOB + ['--mesh', 'stage=2,data=2', '--pipeline-stages', '4'])
  with pytest.raises(job.UsageError, match=r'^--mesh stage=2,data=2: stage=2 spreads a '
                                           r'pipeline of 2 stages, but --pipeline-stages is 4\. '
                                           r'Fix: --pipeline-stages 2, or --mesh without stage'):
    job.check_mesh(args, {'stage': 2, 'data': 2, 'model': 1})


@pytest.mark.parametrize('flags, expected', [
    (['--warmup', '8'], '--warmup 8 must be at least 0 and below --steps 8'),
    (['--pipeline-stages', '3'], '--pipeline-stages 3: it does not divide the 4 blocks'),
    (['--pipeline-stages', '2', '--microbatches', '3'],
     '--microbatches 3: it does not divide the 16 problems of --batch'),
    (['--mesh', 'data=2,foo=1'], "--mesh data=2,foo=1: unknown axis 'foo'"),
    (['--mesh', 'data=4'], '--mesh data=4: 4 devices asked for, 1 present'),
])
def test_the_main_job_names_the_flag_at_fault(capsys, tmp_path, flags, expected):
  out = tmp_path / 'out'
  line = one_line_error(capsys, load('train_lm').main, TINY_JOB + ['--out', str(out), *flags])
  assert line.startswith(f'error: {expected}'), line
  assert 'Fix: ' in line, line
  assert not out.exists()  # refused before anything is written
