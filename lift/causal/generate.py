"""`generate`: a decode loop on the step `as_scan` derives, for a batch of prompts.

The prompt is prefilled in parallel, then one `lax.while_loop` feeds each new token
back through the derived step until every row has met a stop token or
`max_new_tokens` are out. Prompts of different lengths are moved to the right end of
the prompt window (left padding), so that every row takes its next token at the same
step; the model sees which positions are padding and numbers its positions from it.
"""
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from lift.causal.api import Length, derive
from lift.errors import DecodeArgumentError

LogitsFn = Callable[..., jax.Array]


class Sampling(NamedTuple):
  """Draws each token from the model's distribution, reshaped.

  Attributes:
    temperature: logits are divided by it; 0 picks the most likely token.
    top_k: keep only the `top_k` most likely tokens (None: all).
    top_p: keep the smallest set of most likely tokens whose probability reaches
      `top_p` (nucleus sampling; None: all).

  Examples:
    >>> def logits_fn(tokens):  # prefers the next token, 4 to 1, over the one after
    ...   return jnp.log(jax.nn.one_hot((tokens + 1) % 8, 8) * 0.8
    ...                  + jax.nn.one_hot((tokens + 2) % 8, 8) * 0.2 + 1e-9)
    >>> lift.generate(logits_fn, jnp.array([[1]]), max_new_tokens=4,
    ...               sampling=lift.Sampling(top_k=1), key=jax.random.key(0)).tokens
    Array([[2, 3, 4, 5]], dtype=int32)
  """
  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None


class Generated(NamedTuple):
  """What `generate` returns.

  Attributes:
    tokens: `[batch, max_new_tokens]`, the new tokens; after a row's stop token,
      `pad_token`.
    lengths: `[batch]`, the new tokens of each row, its stop token included.

  Examples:
    >>> out = lift.generate(lambda t: jax.nn.one_hot((t + 1) % 8, 8), jnp.array([[5], [1]]),
    ...                     max_new_tokens=4, stop_tokens=[7])
    >>> out.tokens, out.lengths
    (Array([[6, 7, 0, 0],
           [2, 3, 4, 5]], dtype=int32), Array([2, 4], dtype=int32))
  """
  tokens: jax.Array
  lengths: jax.Array


def generate(logits_fn: LogitsFn, prompts: Any, *, max_new_tokens: int,
             prompt_mask: Any = None, prompt_lengths: Any = None,
             sampling: Sampling | None = None, key: jax.Array | None = None,
             stop_tokens: Any = (), pad_token: int = 0) -> Generated:
  """Decodes a batch of prompts with the step derived from a causal model.

  `logits_fn` is the training-mode model: `[batch, length]` tokens to
  `[batch, length, vocab]` logits, causal along length. With prompts of different
  lengths (`prompt_mask` or `prompt_lengths`) it is called as
  `logits_fn(tokens, valid)`, `valid` `[batch, length]` marking the real tokens:
  the model must mask the padding keys out of its attention and number positions
  from `valid` (`jnp.cumsum(valid, 1) - 1`); each row then decodes as it would
  alone. Jittable: prefill and loop are one program; the loop stops when every
  row has met a stop token.

  Not for beam search or speculative decoding: write those on `as_scan`'s step.

  Args:
    logits_fn: `logits_fn(tokens)`, or `logits_fn(tokens, valid)` for ragged prompts.
    prompts: `[batch, P]` int tokens.
    max_new_tokens: how many tokens to generate per row, at most.
    prompt_mask: `[batch, P]` bool, True on the real tokens (left- or right-padded).
    prompt_lengths: `[batch]` int, for right-padded prompts (instead of the mask).
    sampling: None for greedy decoding, or a `Sampling`.
    key: a PRNG key, needed when sampling.
    stop_tokens: token ids that end a row: `[k]`, or `[batch, k]` per row.
    pad_token: what follows a row's stop token.

  Returns:
    `Generated(tokens, lengths)`.

  Examples:
    >>> def logits_fn(tokens):  # counts up: the next token is the last one + 1
    ...   return jax.nn.one_hot((tokens + 1) % 8, 8) * 10.0
    >>> lift.generate(logits_fn, jnp.array([[1, 2], [5, 6]]), max_new_tokens=3,
    ...               stop_tokens=[0]).tokens
    Array([[3, 4, 5],
           [7, 0, 0]], dtype=int32)
  """
  prompts = jnp.asarray(prompts)
  _check(prompts, max_new_tokens, sampling, key, prompt_mask, prompt_lengths)
  ragged = prompt_mask is not None or prompt_lengths is not None
  valid = _prompt_valid(prompts, prompt_mask, prompt_lengths)
  tokens, valid = _left_aligned(prompts, valid)
  stops = jnp.asarray(stop_tokens, jnp.int32)
  stops = stops.reshape(1, -1) if stops.ndim < 2 else stops  # [1 or batch, k]
  g, prompt = _time_first(logits_fn, tokens, valid, ragged)
  capacity = prompts.shape[1] + max_new_tokens - 1
  example = jax.tree.map(lambda x: jax.ShapeDtypeStruct((capacity, *x.shape[1:]), x.dtype),
                         prompt)
  step, carry, prompt_logits = derive(g, example, prompt, capacity, _wording(
      prompts.shape[1], max_new_tokens))
  pick = _picker(sampling, key)
  first = pick(prompt_logits[-1], 0)
  feed = (lambda token: (token, jnp.ones_like(token, bool))) if ragged else (lambda t: t)
  return _loop(step, carry, first, feed, pick, stops, max_new_tokens, pad_token)


def _wording(prompt_length: int, max_new_tokens: int) -> Length:
  length = prompt_length + max_new_tokens - 1
  return Length(length, (
      f"lift.generate runs the model at length P + max_new_tokens - 1 = {prompt_length} + "
      f"{max_new_tokens} - 1 = {length} (the prompt, then each new token but the last)"),
                "ask for fewer new tokens (max_new_tokens)")


def _loop(step, carry, first, feed, pick, stops, count: int, pad_token: int) -> Generated:
  batch = first.shape[0]
  out = jnp.full((batch, count), pad_token, jnp.int32).at[:, 0].set(first)
  done = _is_stop(first, stops)

  def more(state):
    return (state[0] < count) & ~jnp.all(state[3])

  def body(state):
    t, carry, token, done, out, lengths = state
    carry, logits = step(carry, feed(token))
    token = jnp.where(done, pad_token, pick(logits, t)).astype(jnp.int32)
    lengths = jnp.where(done, lengths, t + 1)
    return (t + 1, carry, token, done | _is_stop(token, stops), out.at[:, t].set(token),
            lengths)

  state = (jnp.int32(1), carry, first, done, out, jnp.ones((batch,), jnp.int32))
  state = lax.while_loop(more, body, state)
  return Generated(state[4], state[5])


def _is_stop(token: jax.Array, stops: jax.Array) -> jax.Array:
  return jnp.any(token[:, None] == stops, axis=1)


def _picker(sampling: Sampling | None, key) -> Callable[[jax.Array, Any], jax.Array]:
  """`pick(logits [batch, vocab], t) -> tokens [batch]`."""
  if sampling is None or sampling.temperature == 0:
    return lambda logits, t: jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def pick(logits, t):
    logits = logits.astype(jnp.float32) / sampling.temperature
    if sampling.top_k is not None:
      kth = lax.top_k(logits, sampling.top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    if sampling.top_p is not None:
      logits = _nucleus(logits, sampling.top_p)
    drawn = jax.random.categorical(jax.random.fold_in(key, t), logits, axis=-1)
    return drawn.astype(jnp.int32)

  return pick


def _nucleus(logits: jax.Array, top_p: float) -> jax.Array:
  """Keeps the most likely tokens until their probability reaches `top_p`."""
  ordered = jnp.sort(logits, axis=-1)[:, ::-1]
  probabilities = jax.nn.softmax(ordered, axis=-1)
  before = jnp.cumsum(probabilities, axis=-1) - probabilities  # mass of the likelier ones
  kept = jnp.where(before < top_p, ordered, jnp.inf)
  return jnp.where(logits < jnp.min(kept, axis=-1, keepdims=True), -jnp.inf, logits)


def _prompt_valid(prompts, prompt_mask, prompt_lengths) -> jax.Array:
  if prompt_mask is not None:
    return jnp.asarray(prompt_mask, bool)
  positions = jnp.arange(prompts.shape[1])[None]
  if prompt_lengths is not None:
    return positions < jnp.asarray(prompt_lengths)[:, None]
  return jnp.ones(prompts.shape, bool)


def _left_aligned(tokens, valid) -> tuple[jax.Array, jax.Array]:
  """Each row's real tokens moved to the end, in order; the padding before them."""
  order = jnp.argsort(valid, axis=1, stable=True)  # padding first
  return (jnp.take_along_axis(tokens, order, axis=1).astype(jnp.int32),
          jnp.take_along_axis(valid, order, axis=1))


def _time_first(logits_fn, tokens, valid, ragged: bool):
  """`g` for `as_scan` (time on axis 0 in and out) and the prompt in its layout."""
  if ragged:
    def g(xs):
      return jnp.moveaxis(logits_fn(xs[0].T, xs[1].T), 1, 0)
    return g, (tokens.T, valid.T)

  def g_tokens(xs):
    return jnp.moveaxis(logits_fn(xs.T), 1, 0)
  return g_tokens, tokens.T


def _check(prompts, max_new_tokens, sampling, key, prompt_mask, prompt_lengths) -> None:
  problems: Sequence[tuple[bool, str, str]] = (
      (prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer),
       f'prompts must be [batch, length] int tokens; got {prompts.dtype}{list(prompts.shape)}',
       'pass token ids, e.g. jnp.asarray(prompts, jnp.int32), one row per prompt'),
      (not isinstance(max_new_tokens, int) or max_new_tokens < 1,
       f'max_new_tokens must be a positive int; got {max_new_tokens!r}',
       'pass the number of tokens to generate per row, e.g. max_new_tokens=32'),
      (sampling is not None and not isinstance(sampling, Sampling),
       f'sampling must be None or a lift.Sampling; got {sampling!r}',
       'leave it out for greedy decoding, or pass lift.Sampling(temperature=..., top_k=...)'),
      (isinstance(sampling, Sampling) and sampling.temperature != 0 and key is None,
       'sampling draws tokens at random but no key was given',
       'pass key=jax.random.key(seed)'),
      (prompt_mask is not None and prompt_lengths is not None,
       'prompt_mask and prompt_lengths were both given',
       'pass one: prompt_mask for any padding, prompt_lengths for right padding'),
  )
  for failed, problem, fix in problems:
    if failed:
      raise DecodeArgumentError(f'lift.generate: {problem}. Fix: {fix}.')
