// End to end through a real relay on loopback, with real SQLite files.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Protocol } from '../js/index.js'
import { connected, ofType, peerConfig, record, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'


test('a message is delivered and acknowledged end to end', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'hello bob', { priority: 'high', metadata: { k: 'v' } })
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(received.content, 'hello bob')
  // Senders are named by their identity address, which the relay verified and stamps.
  assert.equal(received.sender, alice.protocol.localAddress())
  assert.match(received.sender, /^off1[a-z0-9]{40}$/)
  assert.deepEqual(received.metadata, { k: 'v' })
  const delivered = await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(delivered.recipient, 'bob')
  assert.equal(delivered.transport, 'internet')
  assert.ok(delivered.latencyMs >= 0)
  assert.equal(await alice.protocol.getMessageStatus(id), 'delivered')
  assert.equal(ofType(alice.recorder, 'message_sent').filter((e) => e.messageId === id)[0].priority, 'high')
  assert.equal(alice.protocol.stats().outboxRegular, 0)
})

test('binary content arrives as a Uint8Array', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const bytes = new Uint8Array([0, 1, 2, 250, 255])
  const id = await alice.protocol.sendMessage('bob', bytes, { contentType: 'file' })
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.ok(received.content instanceof Uint8Array)
  assert.deepEqual([...received.content], [...bytes])
  assert.equal(received.contentType, 'file')
})

test('a message to an offline recipient is stored by the relay and delivered when it starts', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  // Bob connects once so the relay knows the account, then goes away.
  const first = new Protocol(peerConfig('bob', dir, relay.url))
  const firstEvents = record(first)
  await first.start()
  await waitFor(firstEvents, connected)
  await first.stop()

  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'while you were away')
  await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === id)
  assert.equal(ofType(alice.recorder, 'message_delivered').length, 0)

  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(received.content, 'while you were away')
  await waitFor(bob.recorder, (e) => e.type === 'inbound_drain_completed')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(ofType(alice.recorder, 'message_failed').length, 0)
})

test('a message sent while the sender is offline is deferred, then flushed on reconnect', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))

  alice.protocol.internetStatusChanged(false)
  await waitFor(alice.recorder, (e) => e.type === 'internet_status_changed' && !e.connected)
  const ids = []
  for (let i = 0; i < 25; i++) ids.push(await alice.protocol.sendMessage('bob', `offline ${i}`))
  await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === ids[24])
  assert.equal(await alice.protocol.getMessageStatus(ids[0]), 'queued')

  alice.protocol.internetStatusChanged(true)
  for (const id of ids) {
    await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { what: `delivery of ${id}` })
  }
  const received = ofType(bob.recorder, 'message_received').map((e) => e.content)
  assert.equal(new Set(received).size, 25)
})

test('an id already delivered or already in the outbox is a no-op', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'once', { id: 'order-42' })
  assert.equal(id, 'order-42')
  assert.equal(await alice.protocol.sendMessage('bob', 'once', { id: 'order-42' }), 'order-42')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  const mark = alice.recorder.events.length
  assert.equal(await alice.protocol.sendMessage('bob', 'once again', { id: 'order-42' }), 'order-42')
  // A message sent after it takes the same ordered path through the relay, and its ACK the same
  // path back: had order-42 been taken again, its frame, its ACK and its events would all have
  // come before these.
  const after = await alice.protocol.sendMessage('bob', 'after')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === after)
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === after)
  const since = alice.recorder.events.slice(mark).filter((e) => e.messageId === id)
  assert.deepEqual(since.map((e) => e.type), [], 'nothing happened to order-42 after it was delivered')
  assert.equal(ofType(alice.recorder, 'message_delivered').filter((e) => e.messageId === id).length, 1)
  assert.deepEqual(ofType(bob.recorder, 'message_received').map((e) => e.content), ['once', 'after'])
  assert.equal(await alice.protocol.getMessageStatus(id), 'delivered')
})

test('diagnostics are forwarded at the configured logLevel and above only', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const quiet = await started(t, peerConfig('quiet', dir, relay.url))
  const chatty = await started(t, peerConfig('chatty', dir, relay.url, { logLevel: 'info' }))
  const info = (r) => ofType(r, 'diagnostic').filter((e) => e.level === 'info')
  assert.ok(info(chatty.recorder).some((e) => /relay connected/.test(e.message) && e.target.length > 0))
  assert.equal(info(quiet.recorder).length, 0)
})

test('the sender reconnects by itself when the relay comes back, and flushes what it deferred', async (t) => {
  const dir = tempDir(t)
  const { Relay } = await import('../js/index.js')
  const { SECRET } = await import('./helpers.mjs')
  const relayOptions = { storage: { path: `${dir}/relay.db` }, jwtSecret: SECRET }
  let relay = await Relay.start({ listen: '127.0.0.1:0', ...relayOptions })
  const port = relay.port
  t.after(() => relay.stop())
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))

  await relay.stop()
  await waitFor(alice.recorder, (e) => e.type === 'internet_status_changed' && !e.connected)
  const id = await alice.protocol.sendMessage('bob', 'sent while the relay was down')
  await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === id)

  relay = await Relay.start({ listen: `127.0.0.1:${port}`, ...relayOptions })
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id, { timeoutMs: 15_000 })
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 15_000 })
  assert.ok(ofType(alice.recorder, 'internet_status_changed').filter((e) => e.connected).length >= 2)
})

test('a second session for the account supersedes the first, which stays down until told to reconnect', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const first = await started(t, { ...peerConfig('alice', dir, relay.url), storage: { path: `${dir}/alice-laptop.db` } })
  const second = await started(t, { ...peerConfig('alice', dir, relay.url), storage: { path: `${dir}/alice-phone.db` } })
  const superseded = await waitFor(first.recorder, (e) => e.type === 'internet_session_superseded')
  assert.equal(superseded.reason, 'new_session')
  await waitFor(first.recorder, (e) => e.type === 'internet_status_changed' && !e.connected)

  // The second session works; the first has not come back by itself meanwhile.
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const id = await second.protocol.sendMessage('bob', 'from the phone')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  const connects = (r) => ofType(r, 'internet_status_changed').filter((e) => e.connected).length
  assert.equal(connects(first.recorder), 1)
  assert.equal(ofType(first.recorder, 'internet_session_superseded').length, 1)

  // An explicit reconnect takes the session back.
  first.protocol.internetStatusChanged(true)
  await waitFor(second.recorder, (e) => e.type === 'internet_session_superseded')
  await until(() => connects(first.recorder) === 2, { what: 'the first session to reconnect' })
})
