"""Mistakes with `lift.loops` (scan, fold, map, scan_taps, checkpoint policies) and `as_scan`."""
import jax
import jax.numpy as jnp

import linen_ext as nn
from linen_ext import errors as errors_nn
import lift
from lift import as_scan, as_scan_with_prefill, errors, loops
from lift.loops import ScanCheckpointPolicy as Policy

from tests.misuse import case

add = lambda c, x: (c + x, c)
sum2 = lambda a, b: a + b

POLICIES = [
    case("jax.jvp through a loop with remat='nested'", lambda: jax.jvp(
        loops.fold(lambda c, x: jnp.sin(c * x), remat='nested'), (1.0, jnp.ones(3)),
        (1.0, jnp.ones(3))), errors.NestedForwardModeError, "remat='nested'", 'jax.grad',
         "Fix: for forward mode give this loop remat='full'", flax_error=TypeError),
    case('loops.scan remat given a misspelled policy', lambda: loops.scan(add, remat='nestd'),
         errors.RematPolicyError, "remat='nestd'", 'False', 'True', "'full'", "'nested'",
         "'offload'", "'save_all'", 'ScanCheckpointPolicy'),
    case('run_scan remat given a number', lambda: loops.run_scan(add, 0.0, jnp.ones(3), remat=3),
         errors.RematPolicyError, 'remat=3'),
    case('fold remat given a number', lambda: loops.fold(lambda c, x: c + x, remat=3)(
        0.0, jnp.ones(3)), errors.RematPolicyError, 'remat=3'),
    case('a policy that does not save carries', lambda: Policy(save_carries=False),
         errors.RematPolicyError, 'save_carries=False', "'offload'", 'nested=True'),
    case('save_block_internals given a string', lambda: Policy(save_block_internals='attn'),
         errors.RematPolicyError, "save_block_internals='attn'", "['attn_out']"),
    case('a block internal both saved and offloaded', lambda: Policy(
        save_block_internals=['h', 'g'], offload_block_internals=['h']), errors.RematPolicyError,
         "['h']", 'both', 'Fix: remove'),
    case('nested=0', lambda: Policy(nested=0), errors.RematPolicyError, 'nested=0',
         'Fix: nested=True or nested=4'),
    case('nested with save_block_internals', lambda: Policy(
        nested=True, save_block_internals=['h']),
         errors.RematPolicyError, "nested=True, save_block_internals=('h',))",
         'Fix: drop save_block_internals'),
    case('more nested blocks than loop steps', lambda: loops.scan(add, remat=Policy(nested=9))(
        jnp.float32(0.0), jnp.ones(5)), errors.RematPolicyError,
         'nested=9 outer blocks for a loop of 5 steps', 'Fix: nested=True'),
    case('a JAX policy combined with other fields', lambda: Policy(
        jax_policy=jax.checkpoint_policies.nothing_saveable, save_inputs='offload',
        save_block_internals=True), errors.RematPolicyError,
         'cannot be combined with save_inputs, save_block_internals'),
]

LOOPS = [
    case('loop inputs of different lengths', lambda: loops.run_scan(
        add, 0.0, {'a': jnp.ones(3), 'b': jnp.ones(4)}), errors.ScanLengthError,
         "xs['a']: 3, xs['b']: 4"),
    case('a scalar among the scanned inputs', lambda: loops.run_scan(
        add, 0.0, {'s': jnp.float32(1.0)}),
         errors.ScanLengthError, "['s'] of xs is a scalar", 'Fix: close over'),
    case('loop length disagreeing with the inputs', lambda: loops.scan(add, length=4)(
        jnp.float32(0.0), jnp.ones(3)), errors.ScanLengthError, 'length=4 but xs has 3',
         'Fix: drop length= or pass length=3'),
    case('run_scan with nothing scanned and no length', lambda: loops.run_scan(add, 0.0, None),
         errors.ScanLengthError, 'no scanned leaf', 'Fix: pass length=N'),
    case('loops.scan with nothing scanned and no length', lambda: loops.scan(add)(0.0, None),
         errors.ScanAxisError, 'no scanned leaf', 'Fix: pass length=N'),
    case('loop axis given a name', lambda: loops.fold(lambda c, x: c, axis='time'),
         errors.ScanAxisError, "fold: axis='time' is not an int"),
    case('loop axis in no input', lambda: loops.scan(add, axis=2)(
        jnp.zeros(3), {'a': jnp.ones((3, 2)), 'b': 1.0}), errors.ScanAxisError,
         'axis=2 exists in no leaf', 'ranks'),
    case('loops.map over a scalar only', lambda: loops.map(lambda x: x)(3.0), errors.ScanAxisError,
         'map: xs has no leaf to map over', 'call f directly'),
    case('fold over nothing without a length', lambda: loops.fold(lambda c, x: c)(0.0, None),
         errors.ScanAxisError, 'fold: cannot tell the number of steps', 'fold(f, length=10)'),
    case('scan_taps output tap 0', lambda: loops.scan_taps(lambda a, b: a, n_steps=2, outputs_info=[
        {'initial': jnp.zeros(2), 'taps': [-1, 0]}]), errors.ScanTapsError,
         'outputs_info[0] has taps [-1, 0]'),
    case('scan_taps initial value too short for its taps', lambda: loops.scan_taps(
        sum2, n_steps=2, outputs_info=[{'initial': jnp.zeros(2), 'taps': [-3, -1]}]),
         errors.ScanTapsError, 'taps [-3, -1]', '3 previous', 'shape (2,)'),
    case('scan_taps sequences of different lengths', lambda: loops.scan_taps(
        sum2, sequences=[jnp.ones(5), jnp.ones(4)]), errors.ScanTapsError, 'sequences[0]',
         ': 5 steps; sequences[1]', ': 4 steps'),
    case('scan_taps n_steps beyond the sequences', lambda: loops.scan_taps(
        sum2, n_steps=6, sequences={'input': jnp.ones(5), 'taps': [-1, 0]}),
         errors.ScanTapsError, 'n_steps=6 but sequences[0]',
         'only 4 steps'),
    case('scan_taps with neither n_steps nor sequences', lambda: loops.scan_taps(
        lambda h: h, outputs_info=jnp.float32(0.0)), errors.ScanTapsError, 'n_steps=None',
         'no sequences', 'Fix: pass n_steps'),
    case('stack_rows of rows of different shapes', lambda: loops.stack_rows(
        [jnp.zeros(3), jnp.zeros(2)]), errors.StackRowsError, 'row 1 is float32[2]',
         'row 0 is float32[3]', 'same shape'),
    case('unstack_rows of leaves without a shared leading axis', lambda: loops.unstack_rows(
        {'a': jnp.zeros((2, 3)), 'b': jnp.zeros(3)}), errors.StackRowsError, '(2, 3)', '(3,)',
         'axis 0'),
    case('scan_taps fn returning more outputs than outputs_info', lambda: loops.scan_taps(
        lambda h: (h, h), n_steps=2, outputs_info=[jnp.float32(0.0)]), errors.ScanTapsError,
         'fn returned 2 outputs but outputs_info has 1'),
    case('scan_taps sequence given as a dict without input', lambda: loops.scan_taps(
        lambda x: x, sequences=[{'values': jnp.ones(3)}]), errors.ScanTapsError, 'sequences[0]=',
         'expected an array or'),
]


class LooksAhead(nn.Module):
  @nn.compact
  def __call__(self, x):  # [batch, length, features]
    return nn.Conv(4, kernel_size=(3,), padding='SAME')(x)


def _non_causal_module(level):
  x = jnp.ones((1, 6, 2))
  variables = LooksAhead().init(jax.random.key(0), x)
  if level == 'module':
    return nn.as_scan(LooksAhead(), variables, x, time_axis=1)
  return as_scan(lambda z: LooksAhead().apply(variables, z[None])[0], x[0])


def _masked_attention(x, mask):
  logits = jnp.einsum('qd,kd->qk', x, x)
  return jax.nn.softmax(jnp.where(mask, logits, -1e9)) @ x


def _upper_triangular_attention(x):  # each query sees itself and the later keys
  return _masked_attention(x, jnp.triu(jnp.ones((x.shape[0],) * 2, bool)))


def _masked_after_softmax(x):  # the softmax already summed over the later keys
  weights = jax.nn.softmax(jnp.einsum('qd,kd->qk', x, x))
  return jnp.where(jnp.tril(jnp.ones((x.shape[0],) * 2, bool)), weights, 1.0) @ x


class Cumsum(nn.Module):
  @nn.compact
  def __call__(self, x):  # [batch, length, features]
    return jnp.cumsum(nn.Dense(2)(x), axis=1)


def _attend(x):  # [T, d]: each position averages itself and the earlier ones
  return (jnp.tril(jnp.ones((x.shape[0],) * 2)) * (x @ x.T)) @ x


def _past_the_cache():
  f, carry = as_scan(_attend, jnp.ones((2, 3)))
  for _ in range(3):
    carry, _ = f(carry, jnp.ones(3))


def _scores_into_a_scan_over_time(x):
  scores = jnp.where(jnp.tril(jnp.ones((x.shape[0],) * 2, bool)), x @ x.T, -jnp.inf)
  return jax.lax.scan(lambda c, row: (c, c + row), jnp.zeros(x.shape[0]), scores)[1]


def _counting(tokens):
  return jax.nn.one_hot((tokens + 1) % 5, 5)


def _batch_as_time():
  x = jnp.ones((2, 5, 3))
  return nn.as_scan(Cumsum(), Cumsum().init(jax.random.key(0), x), x)  # time_axis=0


class PositionTable(nn.Module):
  @nn.compact
  def __call__(self, tokens):  # [batch, length], at most 8 positions
    positions = self.param('positions', nn.initializers.zeros, (8, 4))
    return nn.Embed(5, 4)(tokens) + positions[None, :tokens.shape[1]]


def _generate_past_the_position_table():
  variables = PositionTable().init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  return lift.generate(lambda tokens: PositionTable().apply(variables, tokens),
                       jnp.ones((1, 4), jnp.int32), max_new_tokens=9)


T = 6
XS = jnp.ones((T, 3))
AS_SCAN = [
    case("lift.generate past the model's position table", _generate_past_the_position_table,
         errors.ModelLengthError, 'P + max_new_tokens - 1 = 4 + 9 - 1 = 12',
         'add got incompatible shapes', 'loop_cases.py', 'shapes (1, 12, 4) and (1, 8, 4)',
         'It runs at length 4', 'max_new_tokens'),
    case("as_scan given a max_length past the function's table", lambda: as_scan(
        lambda x: x + XS[:x.shape[0]], XS[:4], max_length=8), errors.ModelLengthError,
         'length 8 (max_length)', 'loop_cases.py', 'It runs at length 4', 'smaller max_length'),
    case('as_scan of an associative scan whose fn accumulates along time', lambda: as_scan(
        lambda x: jax.lax.associative_scan(lambda a, b: a + jnp.cumsum(b, 0), x), XS),
         errors.ScanConversionError, '`associative_scan`', 'lax.associative_scan along the scan axis 0',
         'not applied to each element alone', 'keeps state', 'elementwise over the axis'),
    case("nn.as_scan's default time_axis=0 on [batch, length] inputs", _batch_as_time,
         errors_nn.TimeAxisError, 'time_axis=0', '`Cumsum.__call__`', 'Fix: time_axis=1'),
    case('as_scan of a function whose output moves the time axis', lambda: as_scan(
        lambda x: x.T, jnp.ones((T, T))), errors.ScanConversionError, 'varies along axis 1'),
    case('as_scan of a function shortening the time axis', lambda: as_scan(
        lambda x: x[:-1], jnp.ones((T, T))), errors.ScanConversionError, 'length 6'),
    case('as_scan inputs of different lengths', lambda: as_scan(
        lambda xs: xs, (jnp.ones((3, 2)), jnp.ones((4, 2)))), errors.ScanConversionError,
         'same positive length'),
    case('as_scan_with_prefill given a prefill of another shape', lambda: as_scan_with_prefill(
        jnp.tanh, XS, XS[:2, :2]), errors.ScanConversionError, 'prefill must have'),
    case('as_scan of attention with an upper-triangular mask', lambda: as_scan(
        _upper_triangular_attention, jnp.linspace(0.0, 1.0, 3 * T).reshape(T, 3)),
         errors.ScanConversionError, '`reduce_max`', 'over key time', 'not masked',
         'lower-triangular in (query, key) = axes (0, 1)'),
    case('as_scan of attention masked after the softmax', lambda: as_scan(
        _masked_after_softmax, jnp.linspace(0.0, 1.0, 3 * T).reshape(T, 3)),
         errors.ScanConversionError, '`reduce_max`', 'not masked'),
    case('as_scan of a function returning attention scores', lambda: as_scan(
        lambda x: x @ x.T, XS), errors.ScanConversionError, 'output 0',
         'varies along time on two axes', '@lift.custom_causal'),
    case('a derived step called past the length of its caches', _past_the_cache,
         errors.CacheLengthError, 'element 2', 'caches hold 2 elements', 'max_length='),
    case('as_scan given a max_length shorter than the prefill', lambda: as_scan_with_prefill(
        jnp.tanh, XS, XS[:4], max_length=3), errors.ScanConversionError, 'max_length',
         "prefill's length (4)", 'got 3'),
    case('as_scan of a scan over time given attention scores', lambda: as_scan(
        _scores_into_a_scan_over_time, XS), errors.ScanConversionError, 'two time axes',
         'scan over time', 'Fix:'),
    case('lift.generate sampling without a key', lambda: lift.generate(
        _counting, jnp.ones((2, 3), jnp.int32), max_new_tokens=2,
        sampling=lift.Sampling(temperature=0.7)), errors.DecodeArgumentError, 'lift.generate',
         'no key', 'key=jax.random.key'),
    case('lift.generate given both a prompt mask and prompt lengths', lambda: lift.generate(
        _counting, jnp.ones((2, 3), jnp.int32), max_new_tokens=2, prompt_lengths=[1, 3],
        prompt_mask=jnp.ones((2, 3), bool)), errors.DecodeArgumentError, 'prompt_mask',
         'prompt_lengths', 'both given', 'pass one'),
    case('lift.generate given float prompts', lambda: lift.generate(
        _counting, jnp.ones((2, 3)), max_new_tokens=2), errors.DecodeArgumentError,
         'prompts must be [batch, length] int tokens', 'float32[2, 3]'),
    case('nn.as_scan of a module looking ahead in time', lambda: _non_causal_module('module'),
         errors.ScanConversionError, 'conv_general_dilated', 'anti-causal'),
    case("as_scan of a function applying a module that looks ahead in time",
         lambda: _non_causal_module('function'), errors.ScanConversionError,
         'conv_general_dilated', 'anti-causal'),
]

SCAN_REWRITES = [
    case('optimize_scans given an unknown rewrite', lambda: lift.optimize_scans(
        jnp.sin, rewrites=['push_out_sequence']), errors.ScanRewriteError,
         "'push_out_sequence'", 'push_out_seq', 'merge_inouts', 'rewrites=None'),
    case('optimize_scans given one rewrite name, not a list', lambda: lift.optimize_scans(
        jnp.sin, rewrites='merge'), errors.ScanRewriteError, "rewrites=['merge']"),
    case('nn.RNN optimize given an unknown rewrite', lambda: nn.RNN(
        nn.GRUCell(2), optimize=['fuse']).init(jax.random.key(0), jnp.ones((1, 3, 2))),
         errors.ScanRewriteError, "optimize", "('fuse',)", 'optimize=True'),
]

CASES = POLICIES + LOOPS + AS_SCAN + SCAN_REWRITES
