// `whenDelivered(id)`: a Promise of one message's outcome, whether it settles during the wait,
// while the wait reads the status, or settled before the call.
import assert from 'node:assert/strict'
import { getEventListeners } from 'node:events'
import { test } from 'node:test'

import { Protocol, ProtocolError } from '../js/index.js'
import { PLAINTEXT, peerConfig, record, startRelay, started, strayAddress, tempDir, waitFor } from './helpers.mjs'

const withCode = (code, check = () => {}) => (e) => {
  assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${e}`)
  assert.equal(e.code, code)
  check(e)
  return true
}

/** How `promise` settled, held from now on (so a rejection before the test looks is not unhandled). */
const outcome = (promise) => promise.then((value) => ({ value }), (error) => ({ error }))

/**
 * Holds the status reads `whenDelivered` makes through `protocol.getMessageStatus` until the
 * test answers each with `answer()`: the storage's real answer at that moment.
 */
function holdStatusReads(protocol) {
  const reads = []
  protocol.getMessageStatus = (id) =>
    new Promise((resolve) => {
      reads.push({ id, answer: async () => resolve(await Protocol.prototype.getMessageStatus.call(protocol, id)) })
    })
  return reads
}

/** A device whose only carrier, `void`, takes every frame and delivers none. */
async function lonely(t, dir) {
  const protocol = new Protocol({
    appId: 'test',
    storage: { path: `${dir}/lonely.db` },
    encryption: PLAINTEXT,
    reliability: { ack: { defaultTimeoutMs: 100 }, retry: { maxRetries: 1, initialDelayMs: 10, maxDelayMs: 10 } },
  })
  protocol.registerTransport('void', { send: async () => {} })
  const recorder = record(protocol)
  await protocol.start()
  t.after(() => protocol.stop())
  return { protocol, recorder }
}

test('whenDelivered resolves with the delivery, even one dispatched while it read the status', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const reads = holdStatusReads(alice.protocol)
  const id = await alice.protocol.sendMessage('bob', 'hello')
  const waiting = outcome(alice.protocol.whenDelivered(id))
  // The delivery is dispatched before the status read answers, and that answer is `delivered`:
  // only a wait held from before the read sees the event.
  const delivered = await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(reads.length, 1)
  await reads[0].answer()
  assert.deepEqual(await waiting, { value: delivered })
  assert.equal((await waiting).value, delivered, 'the very event the listeners got')
  assert.equal(delivered.recipient, 'bob')

  delete alice.protocol.getMessageStatus
  assert.equal(await alice.protocol.whenDelivered(id), null, 'delivered before the call: storage has the outcome, not the event')
})

test('whenDelivered rejects with ERR_MESSAGE_FAILED and the message_failed event', async (t) => {
  const dir = tempDir(t)
  const { protocol, recorder } = await lonely(t, dir)
  const reads = holdStatusReads(protocol)
  const id = await protocol.sendMessage('ghost', 'into the void')
  const waiting = outcome(protocol.whenDelivered(id))
  // Without a route the message waits: the status read finds it queued, and the wait goes on.
  await reads[0].answer()
  protocol.neighborDiscovered('ghost', 'void')
  const failed = await waitFor(recorder, (e) => e.type === 'message_failed' && e.messageId === id)
  const { error } = await waiting
  withCode('ERR_MESSAGE_FAILED')(error)
  assert.equal(error.event, failed)
  assert.equal(error.cause, failed)
  assert.equal(error.message, `message ${id} failed: Max retries exceeded`)

  delete protocol.getMessageStatus
  await assert.rejects(
    protocol.whenDelivered(id),
    withCode('ERR_MESSAGE_FAILED', (e) => {
      assert.equal(e.event, undefined)
      assert.equal(e.message, `message ${id} had failed before whenDelivered() was called`)
    }),
  )
})

test('whenDelivered of a connection request rejects on connection_request_undeliverable', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const address = await strayAddress()
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const reads = holdStatusReads(alice.protocol)
  const requestId = await alice.protocol.sendConnectionRequest(address)
  const waiting = outcome(alice.protocol.whenDelivered(requestId))
  const undeliverable = await waitFor(alice.recorder, (e) => e.type === 'connection_request_undeliverable' && e.requestId === requestId)
  await reads[0].answer()
  const { error } = await waiting
  withCode('ERR_MESSAGE_FAILED')(error)
  assert.equal(error.event, undeliverable)
  assert.equal(error.cause, undeliverable)
  assert.equal(error.message, `message ${requestId} failed: the relay cannot reach the peer now`)
})

test('whenDelivered refuses an unknown id and bad arguments, and needs a started protocol', async (t) => {
  const dir = tempDir(t)
  const { protocol } = await lonely(t, dir)
  await assert.rejects(protocol.whenDelivered('never-sent'), withCode('ERR_INVALID_ARGUMENT', (e) => assert.match(e.message, /^no message never-sent in this storage/)))
  await assert.rejects(protocol.whenDelivered(42), withCode('ERR_INVALID_ARGUMENT', (e) => assert.equal(e.message, 'id must be a string')))
  await assert.rejects(protocol.whenDelivered('m', { timeoutMs: 5 }), withCode('ERR_INVALID_ARGUMENT', (e) => assert.equal(e.message, 'options.timeoutMs is not a known option')))
  await assert.rejects(new Protocol({ appId: 'test', storage: { memory: true } }).whenDelivered('m'), withCode('ERR_NOT_STARTED'))
})

test('whenDelivered rejects with ERR_ABORTED on its signal and ERR_NOT_STARTED on stop(), holding nothing after', async (t) => {
  const dir = tempDir(t)
  const { protocol, recorder } = await lonely(t, dir)
  const id = await protocol.sendMessage('ghost', 'waits for a route')
  await waitFor(recorder, (e) => e.type === 'message_deferred' && e.messageId === id)
  const controller = new AbortController()
  const waiting = outcome(protocol.whenDelivered(id, { signal: controller.signal }))
  assert.equal(getEventListeners(controller.signal, 'abort').length, 1)
  controller.abort()
  withCode('ERR_ABORTED', (e) => assert.equal(e.cause, controller.signal.reason))((await waiting).error)
  assert.equal(getEventListeners(controller.signal, 'abort').length, 0, 'an aborted wait still listens to its signal')
  await assert.rejects(protocol.whenDelivered(id, { signal: AbortSignal.abort() }), withCode('ERR_ABORTED'))

  const untilStop = outcome(protocol.whenDelivered(id))
  await protocol.stop()
  withCode('ERR_NOT_STARTED')((await untilStop).error)
})
