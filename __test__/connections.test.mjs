// Connection requests from the public API (`docs/delivery.md#connection-requests`), with
// encryption on as an app configures it by default: a request reaches the peer, survives its
// restart, and accepting it sets the session up both ways at once; bad calls are refused with
// typed errors and change nothing; and what becomes of strangers' messages is the app's choice.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { PLAINTEXT, peerConfig, startRelay, started, tempDir, waitFor } from './helpers.mjs'

/** A device as an app configures it by default (sealed), plus `extra`. */
function sealed(name, dir, url, extra = {}) {
  const { encryption, ...config } = peerConfig(name, dir, url)
  assert.equal(encryption, PLAINTEXT)
  return { ...config, ...extra }
}

/** Started, and reachable at its address (the relay read its declaration before the drain). */
async function device(t, name, dir, url, extra) {
  const peer = await started(t, sealed(name, dir, url, extra))
  await waitFor(peer.recorder, (e) => e.type === 'inbound_drain_completed')
  return { ...peer, address: peer.protocol.localAddress() }
}

const invalid = (e) => e instanceof ProtocolError && e.code === 'ERR_INVALID_ARGUMENT'

test('a request survives the peer restarting, and accepting it sets the session up both ways', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await device(t, 'alice', dir, relay.url)
  let bob = await device(t, 'bob', dir, relay.url)

  const id = await alice.protocol.sendConnectionRequest(bob.address, { message: 'hi, it is Alice' })
  const request = await waitFor(bob.recorder, (e) => e.type === 'connection_request_received')
  assert.deepEqual(request, { type: 'connection_request_received', requestId: id, sender: alice.address, message: 'hi, it is Alice', implicit: false })
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { what: "the request, by bob's signed ACK" })

  await bob.protocol.stop()
  bob = await device(t, 'bob', dir, relay.url)
  const [waiting] = await bob.protocol.connectionRequests()
  assert.equal(waiting.requestId, id)
  assert.equal(waiting.peer, alice.address)
  assert.equal(waiting.incoming, true)
  assert.equal(waiting.message, 'hi, it is Alice')
  assert.equal((await alice.protocol.connectionRequests())[0].incoming, false)

  await bob.protocol.acceptConnection(id)
  await waitFor(alice.recorder, (e) => e.type === 'connection_accepted' && e.requestId === id && e.peer === bob.address)
  assert.deepEqual(await bob.protocol.connectionRequests(), [])
  assert.deepEqual(await alice.protocol.connectionRequests(), [])

  // Both sides hold the session now: nothing waits for one, both ways.
  const hello = await alice.protocol.sendMessage(bob.address, 'sealed at once')
  assert.equal(alice.protocol.stats().preSession, 0)
  const got = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === hello)
  assert.equal(got.encrypted, true)
  assert.equal(got.knownSender, true)
  const back = await bob.protocol.sendMessage(alice.address, 'and back')
  assert.equal(bob.protocol.stats().preSession, 0)
  const reply = await waitFor(alice.recorder, (e) => e.type === 'message_received' && e.messageId === back)
  assert.equal(reply.encrypted, true)
  assert.equal(reply.knownSender, true)
})

test('bad connection calls are refused with typed errors and change nothing', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await device(t, 'alice', dir, relay.url)
  await assert.rejects(alice.protocol.sendConnectionRequest('bob'), invalid)
  await assert.rejects(alice.protocol.sendConnectionRequest(alice.address), invalid)
  await assert.rejects(alice.protocol.sendConnectionRequest(alice.address, { note: 'x' }), invalid)
  await assert.rejects(alice.protocol.sendConnectionRequest(alice.address, { message: 'x'.repeat(1025) }), invalid)
  await assert.rejects(alice.protocol.acceptConnection('no-such-request'), invalid)
  await assert.rejects(alice.protocol.rejectConnection(42), invalid)
  await assert.rejects(alice.protocol.cancelConnectionRequest('no-such-request'), invalid)
  assert.deepEqual(await alice.protocol.connectionRequests(), [])
  assert.equal(alice.protocol.stats().outboxRegular, 0)
})

test("strangers' messages are flagged, or held for a request, as the app chose", async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const open = await device(t, 'open', dir, relay.url)
  const careful = await device(t, 'careful', dir, relay.url, { encryption: { unknownSenders: 'request' } })
  const quick = { reliability: { ack: { defaultTimeoutMs: 300 }, retry: { initialDelayMs: 100, maxDelayMs: 300 } } }
  const stranger = await device(t, 'stranger', dir, relay.url, quick)

  const flagged = await stranger.protocol.sendMessage(open.address, 'hello')
  const got = await waitFor(open.recorder, (e) => e.type === 'message_received' && e.messageId === flagged)
  assert.equal(got.knownSender, false)

  const held = await stranger.protocol.sendMessage(careful.address, 'may I?')
  const request = await waitFor(careful.recorder, (e) => e.type === 'connection_request_received')
  assert.equal(request.implicit, true)
  assert.equal(request.sender, stranger.address)
  assert.equal(careful.recorder.events.filter((e) => e.type === 'message_received').length, 0)
  await careful.protocol.acceptConnection(request.requestId)
  const let_in = await waitFor(careful.recorder, (e) => e.type === 'message_received' && e.messageId === held, { what: 'the held message, sent again' })
  assert.equal(let_in.knownSender, true)
  await waitFor(stranger.recorder, (e) => e.type === 'message_delivered' && e.messageId === held)
})
