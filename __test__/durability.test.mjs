// Opt-in at-least-once inbound delivery: nothing is acknowledged before the app's hook has it.
import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { Protocol, ProtocolError } from '../js/index.js'
import { PeerProcess, connected, ofType, peerConfig, record, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'


/** Connects once so the relay knows the account, then goes offline. */
async function knownThenOffline(config) {
  const p = new Protocol(config)
  const r = record(p)
  await p.start()
  await waitFor(r, connected)
  await p.stop()
}

test('config: the hook must be a function, and needs a storage file', (t) => {
  const dir = tempDir(t)
  assert.throws(
    () => new Protocol({ appId: 'a', storage: { memory: true }, inboundDurabilityHook: async () => {} }),
    (e) => e instanceof ProtocolError && e.code === 'ERR_UNSUPPORTED_DURABILITY_BACKEND',
  )
  assert.throws(
    () => new Protocol({ appId: 'a', storage: { path: join(dir, 'x.db') }, inboundDurabilityHook: 'yes' }),
    (e) => e.code === 'ERR_CONFIG' && /inboundDurabilityHook/.test(e.message),
  )
  assert.ok(new Protocol({ appId: 'a', storage: { path: join(dir, 'x.db') }, inboundDurabilityHook: async () => {} }))
})

test('an offline backlog of 1 000 messages reaches the hook once each, in order, in batches of at most 400', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  await knownThenOffline(peerConfig('bob', dir, relay.url))
  // Two senders, since one outbox holds 500 messages.
  const senders = [await started(t, peerConfig('alice', dir, relay.url)), await started(t, peerConfig('carol', dir, relay.url))]
  const sent = new Map()
  for (const [i, s] of senders.entries()) {
    const ids = await Promise.all(Array.from({ length: 500 }, (_, n) => s.protocol.sendMessage('bob', `m${i}-${n}`)))
    sent.set(s.protocol.localAddress(), ids)
  }
  for (const s of senders) {
    const last = sent.get(s.protocol.localAddress()).at(-1)
    await waitFor(s.recorder, (e) => e.type === 'message_stored' && e.messageId === last, { timeoutMs: 30_000 })
  }
  const delivered = new Set()
  for (const s of senders) s.protocol.onEvent((e) => e.type === 'message_delivered' && delivered.add(e.messageId))

  const batches = []
  const bob = await started(t, {
    ...peerConfig('bob', dir, relay.url),
    inboundDurabilityHook: async (batch) => {
      // Nothing of this batch may be acknowledged to its sender yet.
      const early = batch.filter((m) => delivered.has(m.messageId))
      batches.push({ batch, early: early.length })
      await new Promise((resolve) => setTimeout(resolve, 20))
    },
  })
  await waitFor(bob.recorder, (e) => e.type === 'inbound_drain_completed', { timeoutMs: 30_000 })
  // From a third sender: alice's and carol's outboxes are full until their ACKs arrive.
  const dave = await started(t, peerConfig('dave', dir, relay.url))
  const live = await dave.protocol.sendMessage('bob', 'live after the drain')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === live)

  const all = batches.flatMap((b) => b.batch)
  assert.equal(all.length, 1001, 'every message exactly once')
  assert.equal(new Set(all.map((m) => `${m.chat}|${m.sender}|${m.messageId}`)).size, 1001)
  assert.ok(batches.every((b) => b.batch.length <= 400), `batch sizes ${batches.map((b) => b.batch.length)}`)
  assert.ok(batches.some((b) => b.batch.length > 1), 'the drain was batched')
  assert.deepEqual(batches.map((b) => b.early), batches.map(() => 0), 'a message was acknowledged before its batch resolved')
  for (const [sender, ids] of sent) {
    const backlog = all.filter((m) => m.sender === sender).map((m) => m.messageId)
    assert.deepEqual(backlog, ids, `order of ${sender}'s messages`)
  }
  const firstLive = all.findIndex((m) => m.origin === 'live')
  assert.equal(all[firstLive].messageId, live)
  assert.ok(all.slice(0, firstLive).every((m) => m.origin === 'drain'), 'a live message overtook the drain')
  await until(() => [...sent.values()].flat().every((id) => delivered.has(id)), { timeoutMs: 30_000, what: 'every delivery' })
  assert.equal(ofType(bob.recorder, 'message_received').length, 1001)
})

test('a refused batch is not acknowledged, then offered again and committed', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const calls = []
  let refuse = true
  const bob = await started(t, {
    ...peerConfig('bob', dir, relay.url),
    inboundDurabilityHook: async (batch) => {
      calls.push(batch)
      if (refuse) {
        refuse = false
        throw new Error('disk unavailable')
      }
    },
  })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'try again')
  await until(() => calls.length >= 1, { what: 'the first hook call' })
  // Between the refusal and the retry: nothing acknowledged, nothing dispatched, the relay holds it.
  assert.equal(ofType(bob.recorder, 'message_received').length, 0)
  assert.equal(ofType(alice.recorder, 'message_delivered').length, 0)
  assert.ok(relay.stats().storedFrames >= 1, 'the relay released a frame the hook refused')

  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(calls.length, 2)
  assert.equal(calls[1][0].messageId, id)
  assert.equal(calls[1][0].origin, 'redelivery')
  assert.equal(ofType(bob.recorder, 'message_received').length, 1)
})

test('a hook that throws synchronously, returns no Promise, or never settles counts as a failure and is retried', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  let call = 0
  const bob = await started(t, {
    ...peerConfig('bob', dir, relay.url),
    inboundDurabilityHookTimeoutMs: 300,
    inboundDurabilityHook: (batch) => {
      call += 1
      if (call === 1) throw new Error('synchronous failure')
      if (call === 2) return 'not a promise'
      if (call === 3) return new Promise(() => {})
      return Promise.resolve(batch.length)
    },
  })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'third time lucky')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 20_000 })
  assert.equal(call, 4)
  assert.equal(ofType(bob.recorder, 'message_received').length, 1)
})

test('a hook may send back to the sender of the batch without deadlock', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const holder = {}
  const bob = await started(t, {
    ...peerConfig('bob', dir, relay.url),
    inboundDurabilityHook: async (batch) => {
      for (const m of batch) await holder.bob.sendMessage(m.sender, `re: ${m.content}`)
    },
  })
  holder.bob = bob.protocol
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'ping')
  const reply = await waitFor(alice.recorder, (e) => e.type === 'message_received' && e.content === 're: ping')
  assert.equal(reply.sender, bob.protocol.localAddress())
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
})

test('a recipient SIGKILLed inside the hook gets the batch again after restart; the app store holds each message once', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const archive = join(dir, 'bob-archive.txt')
  const marker = join(dir, 'died-once')
  const bobConfig = peerConfig('bob', dir, relay.url)
  const first = new PeerProcess(bobConfig, { PEER_ARCHIVE: archive, PEER_DIE_IN_HOOK: marker })
  t.after(() => first.kill())
  await first.request({ cmd: 'start' })
  await first.waitFor(connected)

  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const ids = []
  for (let i = 0; i < 5; i++) ids.push(await alice.protocol.sendMessage('bob', `crash ${i}`))
  const death = await first.exited
  assert.equal(death.signal, 'SIGKILL')
  assert.ok(existsSync(marker), 'the process did not die inside the hook')
  const seenBeforeDeath = first.hooks.events.flatMap((h) => h.keys)
  assert.ok(seenBeforeDeath.length >= 1)
  assert.equal(ofType(alice.recorder, 'message_delivered').length, 0, 'acknowledged before the hook resolved')

  const second = new PeerProcess(bobConfig, { PEER_ARCHIVE: archive, PEER_DIE_IN_HOOK: marker })
  t.after(() => second.kill())
  await second.request({ cmd: 'start' })
  for (const id of ids) {
    await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 20_000 })
  }
  const seenAfter = second.hooks.events.flatMap((h) => h.keys)
  for (const id of seenBeforeDeath) assert.ok(seenAfter.includes(id), `message ${id} was not offered again`)
  await second.request({ cmd: 'stop' })

  const lines = readFileSync(archive, 'utf8').split('\n').filter(Boolean)
  assert.equal(lines.length, ids.length, 'the app store holds each message once')
  assert.deepEqual(new Set(lines.map((l) => l.split('\t')[2])), new Set(ids))
  for (const id of ids) {
    assert.equal(ofType(alice.recorder, 'message_delivered').filter((e) => e.messageId === id).length, 1)
  }
})

test("the README's SQLite hook stores each message once", async (t) => {
  const { default: Database } = await import('better-sqlite3')
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const db = new Database(join(dir, 'app.db'))
  t.after(() => db.close())
  db.exec(`CREATE TABLE IF NOT EXISTS inbox (
    chat TEXT, sender TEXT, message_id TEXT, content TEXT, received_at INTEGER,
    PRIMARY KEY (chat, sender, message_id))`)
  const insert = db.prepare('INSERT OR IGNORE INTO inbox VALUES (?, ?, ?, ?, ?)')
  const commitBatch = db.transaction((batch) => {
    for (const m of batch) insert.run(m.chat, m.sender, m.messageId, String(m.content), m.timestamp)
  })
  const bob = await started(t, { ...peerConfig('bob', dir, relay.url), inboundDurabilityHook: async (batch) => commitBatch(batch) })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const ids = await Promise.all(Array.from({ length: 50 }, (_, i) => alice.protocol.sendMessage('bob', `row ${i}`)))
  await until(() => ofType(alice.recorder, 'message_delivered').length === 50, { what: '50 deliveries' })
  const rows = db.prepare('SELECT message_id FROM inbox ORDER BY rowid').all().map((r) => r.message_id)
  assert.deepEqual(rows, ids)
  assert.equal(ofType(bob.recorder, 'message_received').length, 50)
})
