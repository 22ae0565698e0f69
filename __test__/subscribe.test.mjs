// `on(type, listener)` and `once(type)`: subscriptions to one event type, which run like
// `onEvent` listeners. A device with an app carrier makes the events on demand.
import assert from 'node:assert/strict'
import { getEventListeners } from 'node:events'
import { test } from 'node:test'

import { Protocol, ProtocolError } from '../js/index.js'
import { PLAINTEXT, record, until, waitFor } from './helpers.mjs'

/** A device whose app carrier `pipe` reports neighbors when the test says so. */
function device() {
  const protocol = new Protocol({ appId: 'test', storage: { memory: true }, encryption: PLAINTEXT })
  protocol.registerTransport('pipe', { send: async () => {} })
  return protocol
}

const withCode = (code, cause) => (e) => {
  assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${e}`)
  assert.equal(e.code, code)
  if (cause !== undefined) assert.equal(e.cause, cause)
  return true
}

test('on(type) gets only that type, in turn with onEvent listeners, until unsubscribed', async (t) => {
  const p = device()
  const calls = []
  p.onEvent((e) => calls.push(['every', e.type]))
  const offFound = p.on('neighbor_discovered', (e) => calls.push(['found', e.peerId]))
  p.on('neighbor_lost', (e) => calls.push(['lost', e.peerId]))
  p.onEvent((e) => calls.push(['every, added last', e.type]))
  const recorder = record(p)
  await p.start()
  t.after(() => p.stop())
  p.neighborDiscovered('bob', 'pipe')
  p.neighborLost('bob', 'pipe')
  await waitFor(recorder, (e) => e.type === 'neighbor_lost')
  offFound()
  p.neighborDiscovered('carol', 'pipe')
  await waitFor(recorder, (e) => e.type === 'neighbor_discovered' && e.peerId === 'carol')
  const neighborCalls = calls.filter(([who, what]) => who === 'found' || who === 'lost' || what.startsWith('neighbor_'))
  assert.deepEqual(neighborCalls, [
    ['every', 'neighbor_discovered'],
    ['found', 'bob'],
    ['every, added last', 'neighbor_discovered'],
    ['every', 'neighbor_lost'],
    ['lost', 'bob'],
    ['every, added last', 'neighbor_lost'],
    ['every', 'neighbor_discovered'],
    ['every, added last', 'neighbor_discovered'],
  ])
})

test('an on(type) listener that throws is reported as a warning and the others still run', async (t) => {
  const warnings = []
  const onWarning = (w) => warnings.push(w)
  process.on('warning', onWarning)
  t.after(() => process.off('warning', onWarning))
  const p = device()
  p.on('neighbor_discovered', () => {
    throw new Error('listener bug')
  })
  const seen = []
  p.on('neighbor_discovered', (e) => seen.push(e.peerId))
  await p.start()
  t.after(() => p.stop())
  p.neighborDiscovered('bob', 'pipe')
  p.neighborDiscovered('carol', 'pipe')
  await until(() => seen.length === 2, { what: 'both events at the second listener' })
  assert.deepEqual(seen, ['bob', 'carol'])
  await until(() => warnings.filter((w) => w.name === 'OfflineCourierListenerError').length === 2, { what: 'two listener warnings' })
  assert.match(warnings.find((w) => w.name === 'OfflineCourierListenerError').message, /listener bug/)
})

test('on and once refuse a type that is not an event type, and bad arguments', async () => {
  const p = device()
  const invalid = (pattern) => (e) => withCode('ERR_INVALID_ARGUMENT')(e) && pattern.test(e.message)
  assert.throws(() => p.on('message_deliverd', () => {}), invalid(/^message_deliverd is not an event type$/))
  assert.throws(() => p.on(42, () => {}), invalid(/^type must be a string$/))
  assert.throws(() => p.on('message_delivered', 'not a function'), invalid(/^listener must be a function$/))
  await assert.rejects(p.once('message_deliverd'), invalid(/^message_deliverd is not an event type$/))
  await assert.rejects(p.once('identity_ready', { timeout: 5 }), invalid(/^options\.timeout is not a known option$/))
  await assert.rejects(p.once('identity_ready', { signal: 'soon' }), invalid(/^options\.signal must be an AbortSignal$/))
  await assert.rejects(p.once('identity_ready', null), invalid(/^options must be an object$/))
})

test('once(type) resolves with the next event of that type and lets go of its signal', async (t) => {
  const p = device()
  const controller = new AbortController()
  const ready = p.once('identity_ready')
  const found = p.once('neighbor_discovered', { signal: controller.signal })
  assert.equal(getEventListeners(controller.signal, 'abort').length, 1)
  await p.start()
  t.after(() => p.stop())
  assert.equal((await ready).address, p.localAddress())
  p.neighborDiscovered('bob', 'pipe')
  p.neighborDiscovered('carol', 'pipe')
  assert.deepEqual(await found, { type: 'neighbor_discovered', peerId: 'bob', transport: 'pipe' })
  assert.equal(getEventListeners(controller.signal, 'abort').length, 0, 'a settled wait still listens to its signal')
})

test('once(type) rejects with ERR_ABORTED on its signal and with ERR_NOT_STARTED on stop()', async () => {
  const p = device()
  const controller = new AbortController()
  const lost = p.once('neighbor_lost', { signal: controller.signal })
  const reason = new Error('the window closed')
  controller.abort(reason)
  await assert.rejects(lost, withCode('ERR_ABORTED', reason))
  assert.equal(getEventListeners(controller.signal, 'abort').length, 0)
  await assert.rejects(p.once('neighbor_lost', { signal: controller.signal }), withCode('ERR_ABORTED', reason))

  await p.start()
  const pending = p.once('neighbor_lost')
  await p.stop()
  await assert.rejects(pending, withCode('ERR_NOT_STARTED'))
})
