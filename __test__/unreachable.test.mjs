// Unreachable recipients end to end: parking on the relay's verdict, presence re-drive, and
// app-supplied local carriers.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Protocol, Relay } from '../js/index.js'
import { PLAINTEXT, SECRET, ofType, peerConfig, record, startRelay, started, tempDir, unsignedControlFrame, until, waitFor } from './helpers.mjs'
import { PipeCarrier } from './pipe-carrier.mjs'


async function noMailboxRelay(t, listen = '127.0.0.1:0') {
  const relay = await Relay.start({ listen, storage: { memory: true }, jwtSecret: SECRET, mailbox: false })
  t.after(() => relay.stop())
  return relay
}

test('an offline recipient parks the message; presence brings it back before any probe is due', async (t) => {
  const dir = tempDir(t)
  const relay = await noMailboxRelay(t)
  const bobFirst = await started(t, peerConfig('bob', dir, relay.url))
  await bobFirst.protocol.stop() // the relay knows bob; bob is offline now
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })

  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'are you back?')
  const undeliverable = await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id)
  const parkedAt = Date.now()
  assert.equal(undeliverable.recipient, 'bob')
  assert.equal(await alice.protocol.getMessageStatus(id), 'parked')
  assert.deepEqual(alice.protocol.internetPresenceWatchlist(), ['bob'])
  assert.equal(alice.protocol.stats().parked, 1)
  await waitFor(alice.recorder, (e) => e.type === 'presence_updated' && e.peerId === 'bob' && !e.online)

  const bob = await started(t, peerConfig('bob', dir, relay.url))
  await waitFor(alice.recorder, (e) => e.type === 'presence_updated' && e.peerId === 'bob' && e.online)
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  // The first probe is due 15 s after the park: delivery came from the presence edge.
  assert.ok(Date.now() - parkedAt < 15_000, 'delivery waited for the probe instead of the presence edge')
  assert.equal(ofType(alice.recorder, 'message_failed').length, 0)
  assert.deepEqual(alice.protocol.internetPresenceWatchlist(), [])
})

test('with the relay down, a neighbor on a local carrier gets the message directly', async (t) => {
  const dir = tempDir(t)
  const pipe = new PipeCarrier()
  const alice = await started(t, { appId: 'test', storage: { path: `${dir}/alice.db` }, encryption: PLAINTEXT }, { connect: false })
  const bob = await started(t, { appId: 'test', storage: { path: `${dir}/bob.db` }, encryption: PLAINTEXT }, { connect: false })
  pipe.attach('alice', alice.protocol)
  pipe.attach('bob', bob.protocol)

  const id = await alice.protocol.sendMessage('bob', 'over the air')
  await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === id)
  pipe.link()
  await waitFor(alice.recorder, (e) => e.type === 'neighbor_discovered' && e.peerId === 'bob' && e.transport === 'pipe')
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(received.transport, 'pipe')
  assert.equal(received.content, 'over the air')
  const delivered = await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(delivered.transport, 'pipe')
  assert.ok(pipe.delivered.some((f) => f.from === 'alice' && f.to === 'bob'))
})

test('a send that fails on a cut local link is retried over the relay once it is back', async (t) => {
  const dir = tempDir(t)
  const relay = await noMailboxRelay(t)
  const port = relay.port
  const pipe = new PipeCarrier()
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  pipe.attach('alice', alice.protocol)
  pipe.attach('bob', bob.protocol)
  pipe.link()
  await waitFor(alice.recorder, (e) => e.type === 'neighbor_discovered' && e.peerId === 'bob')

  await relay.stop()
  await waitFor(alice.recorder, (e) => e.type === 'internet_status_changed' && !e.connected)
  pipe.cut = true // the link fails under the send, before anyone noticed it was gone
  const id = await alice.protocol.sendMessage('bob', 'whichever way works')
  await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === id && /pipe is cut/.test(e.reason))
  pipe.sever()

  const again = await noMailboxRelay(t, `127.0.0.1:${port}`)
  assert.equal(again.port, port)
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id, { timeoutMs: 20_000 })
  const delivered = await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 20_000 })
  assert.equal(delivered.transport, 'internet')
})

test('local carrier inputs are checked', async (t) => {
  const dir = tempDir(t)
  const alice = await started(t, { appId: 'test', storage: { path: `${dir}/alice.db` } }, { connect: false })
  assert.throws(() => alice.protocol.registerTransport('pipe', {}), (e) => e.code === 'ERR_INVALID_ARGUMENT')
  assert.throws(() => alice.protocol.neighborDiscovered('bob', 'nope'), (e) => e.code === 'ERR_INVALID_ARGUMENT')
  alice.protocol.registerTransport('pipe', { send: async () => {} })
  assert.throws(() => alice.protocol.registerTransport('pipe', { send: async () => {} }), (e) => e.code === 'ERR_INVALID_ARGUMENT')
  assert.throws(() => alice.protocol.registerTransport('internet', { send: async () => {} }), (e) => e.code === 'ERR_INVALID_ARGUMENT')
  // Garbage from a peer is the peer's fault: dropped with a diagnostic, never thrown at the app.
  alice.protocol.receiveFrame('pipe', 'mallory', new Uint8Array([1, 2, 3]))
  await waitFor(alice.recorder, (e) => e.type === 'diagnostic' && /mallory/.test(e.message))
  // A control frame without a valid signature is dropped and reported, never delivered.
  alice.protocol.receiveFrame('pipe', 'mallory', unsignedControlFrame(alice.protocol.localAddress()))
  const warning = await waitFor(alice.recorder, (e) => e.type === 'security_warning')
  assert.equal(warning.reasonCode, 'UNSIGNED_CONTROL_REJECTED')
  assert.equal(ofType(alice.recorder, 'message_received').length, 0)
})

test('a transport registered before start() carries messages, and stays registered across stop() and start()', async (t) => {
  const dir = tempDir(t)
  const pipe = new PipeCarrier()
  const alice = new Protocol({ appId: 'test', storage: { path: `${dir}/alice.db` }, encryption: PLAINTEXT })
  const bob = new Protocol({ appId: 'test', storage: { path: `${dir}/bob.db` }, encryption: PLAINTEXT })
  // Apps set their carriers up first; the bad registrations are refused before start() too.
  pipe.attach('alice', alice)
  pipe.attach('bob', bob)
  assert.throws(() => alice.registerTransport('pipe', { send: async () => {} }), (e) => e.code === 'ERR_INVALID_ARGUMENT' && /already registered/.test(e.message))
  assert.throws(() => alice.registerTransport('internet', { send: async () => {} }), (e) => e.code === 'ERR_INVALID_ARGUMENT' && /built-in/.test(e.message))
  const aliceEvents = record(alice)
  const bobEvents = record(bob)
  await alice.start()
  t.after(() => alice.stop())
  await bob.start()
  t.after(() => bob.stop())
  // start() resolves with the carriers registered before it up.
  assert.equal(alice.stats().carriersUp, 1)
  pipe.link()

  const first = await alice.sendMessage('bob', 'over a carrier set up before start')
  const received = await waitFor(bobEvents, (e) => e.type === 'message_received' && e.messageId === first)
  assert.equal(received.transport, 'pipe')
  const delivered = await waitFor(aliceEvents, (e) => e.type === 'message_delivered' && e.messageId === first)
  assert.equal(delivered.transport, 'pipe')

  await alice.stop()
  await alice.start()
  assert.equal(alice.stats().carriersUp, 1)
  assert.throws(() => alice.registerTransport('pipe', { send: async () => {} }), (e) => e.code === 'ERR_INVALID_ARGUMENT')
  pipe.link()
  const second = await alice.sendMessage('bob', 'after a restart')
  const again = await waitFor(bobEvents, (e) => e.type === 'message_received' && e.messageId === second)
  assert.equal(again.transport, 'pipe')
  await waitFor(aliceEvents, (e) => e.type === 'message_delivered' && e.messageId === second && e.transport === 'pipe')
})

test('message_undeliverable says the relay\'s cause: unknown_recipient', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('never-seen', 'to an account the relay never saw')
  const e = await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id)
  assert.equal(e.reasonCode, 'unknown_recipient')
  assert.equal(e.recipient, 'never-seen')
  assert.ok(e.reason.length > 0)
})

test('message_undeliverable says the relay\'s cause: offline_no_mailbox', async (t) => {
  const dir = tempDir(t)
  const relay = await noMailboxRelay(t)
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  await bob.protocol.stop() // the relay knows bob; bob is offline, and there is no mailbox
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'nowhere to keep it')
  const e = await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id)
  assert.equal(e.reasonCode, 'offline_no_mailbox')
  assert.ok(e.reason.length > 0)
})

test('message_undeliverable says the relay\'s cause: mailbox_full', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t, { mailbox: { maxMessages: 1 } })
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  await bob.protocol.stop() // the relay knows bob; bob is offline, and his mailbox holds one
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const kept = await alice.protocol.sendMessage('bob', 'fills the mailbox')
  await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === kept)
  const id = await alice.protocol.sendMessage('bob', 'one too many')
  const e = await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id)
  assert.equal(e.reasonCode, 'mailbox_full')
  assert.ok(e.reason.length > 0)
  assert.equal(alice.recorder.events.filter((e) => e.type === 'message_undeliverable' && e.messageId === kept).length, 0)
})
