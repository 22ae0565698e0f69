// Real processes: SIGKILL at the worst moments, exit after stop(), one writer per storage file.
import assert from 'node:assert/strict'
import { createServer, connect } from 'node:net'
import { join } from 'node:path'
import { test } from 'node:test'

import Database from 'better-sqlite3'

import { PeerProcess, connected, peerConfig, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

function spawnPeer(t, config) {
  const peer = new PeerProcess(config)
  t.after(() => peer.kill())
  return peer
}


test('a child process exits by itself within 5 s of stop()', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const peer = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await peer.request({ cmd: 'start' })
  await peer.waitFor(connected)
  await peer.request({ cmd: 'send', recipient: 'bob', content: 'pending at stop' })
  await peer.request({ cmd: 'stop' })
  const timer = new Promise((resolve) => setTimeout(() => resolve('timeout'), 5000).unref())
  const result = await Promise.race([peer.exited, timer])
  assert.notEqual(result, 'timeout', 'the process did not exit within 5 s after stop()')
  assert.equal(result.code, 0)
})

test('a sender SIGKILLed right after sendMessage resolved delivers exactly once after restart', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = spawnPeer(t, peerConfig('bob', dir, relay.url))
  await bob.request({ cmd: 'start' })
  await bob.waitFor(connected)

  const first = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await first.request({ cmd: 'start' })
  const id = await first.request({ cmd: 'send', recipient: 'bob', content: 'survives a crash' })
  await first.kill()

  const second = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await second.request({ cmd: 'start' })
  await second.waitFor((e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 20_000 })
  await bob.waitFor((e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(await second.request({ cmd: 'status', id }), 'delivered')
  // Let any duplicate that was still travelling arrive before counting.
  await bob.request({ cmd: 'stop' })
  await second.request({ cmd: 'stop' })
  const received = bob.recorder.events.filter((e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(received.length, 1)
  const delivered = [...first.recorder.events, ...second.recorder.events].filter((e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(delivered.length, 1)
})

/** A TCP proxy whose client→server direction can be cut, so a peer's acks never reach the relay. */
async function cuttableProxy(t, targetPort) {
  const state = { cut: false }
  const sockets = new Set()
  const server = createServer((client) => {
    const upstream = connect(targetPort, '127.0.0.1')
    sockets.add(client)
    sockets.add(upstream)
    client.on('data', (chunk) => {
      if (!state.cut) upstream.write(chunk)
    })
    upstream.pipe(client)
    const close = () => {
      client.destroy()
      upstream.destroy()
    }
    client.on('error', close)
    upstream.on('error', close)
    client.on('close', close)
    upstream.on('close', close)
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return { url: `ws://127.0.0.1:${server.address().port}`, state }
}

test('a recipient SIGKILLed before it acked gets the message again and dispatches it once', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const proxy = await cuttableProxy(t, relay.port)

  const bobViaProxy = spawnPeer(t, peerConfig('bob', dir, proxy.url))
  await bobViaProxy.request({ cmd: 'start' })
  await bobViaProxy.waitFor(connected)
  proxy.state.cut = true // from now on nothing bob writes reaches the relay: no Ack, no end-to-end ACK

  const alice = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await alice.request({ cmd: 'start' })
  const id = await alice.request({ cmd: 'send', recipient: 'bob', content: 'at least once' })
  await bobViaProxy.waitFor((e) => e.type === 'message_received' && e.messageId === id)
  await bobViaProxy.kill()

  const bob = spawnPeer(t, peerConfig('bob', dir, relay.url))
  await bob.request({ cmd: 'start' })
  await bob.waitFor((e) => e.type === 'inbound_drain_completed')
  await alice.waitFor((e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 20_000 })
  const again = bob.recorder.events.filter((e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(again.length, 0, 'the redelivered copy was dispatched a second time')
  const drained = bob.recorder.events.find((e) => e.type === 'inbound_drain_completed')
  assert.ok(drained.count >= 1, 'the relay did not redeliver the unacked frame')
})

test('a second process on the same storage file is refused and nothing is sent twice', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = spawnPeer(t, peerConfig('bob', dir, relay.url))
  await bob.request({ cmd: 'start' })
  const one = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await one.request({ cmd: 'start' })
  const id = await one.request({ cmd: 'send', recipient: 'bob', content: 'only once' })

  const two = spawnPeer(t, peerConfig('alice', dir, relay.url))
  await assert.rejects(two.request({ cmd: 'start' }), (e) => e.code === 'ERR_STORAGE')
  await one.waitFor((e) => e.type === 'message_delivered' && e.messageId === id)
  await bob.request({ cmd: 'stop' })
  assert.equal(bob.recorder.events.filter((e) => e.type === 'message_received').length, 1)
  assert.equal(two.recorder.events.filter((e) => e.type === 'message_sent').length, 0)
})

test('a message the recipient never acknowledges climbs the ACK ladder and fails after maxRetries', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const proxy = await cuttableProxy(t, relay.port)
  const bob = spawnPeer(t, peerConfig('bob', dir, proxy.url))
  await bob.request({ cmd: 'start' })
  await bob.waitFor(connected)
  proxy.state.cut = true // bob receives, but none of its ACKs reach the relay

  const alice = spawnPeer(t, peerConfig('alice', dir, relay.url, {
    reliability: { ack: { defaultTimeoutMs: 300 }, retry: { maxRetries: 2, initialDelayMs: 100, maxDelayMs: 150 } },
  }))
  await alice.request({ cmd: 'start' })
  await alice.waitFor(connected)
  const id = await alice.request({ cmd: 'send', recipient: 'bob', content: 'nobody answers' })
  const failed = await alice.waitFor((e) => e.type === 'message_failed' && e.messageId === id)
  assert.equal(failed.reason, 'Max retries exceeded')
  assert.equal(failed.retryCount, 2)
  const mine = alice.recorder.events.filter((e) => e.messageId === id)
  assert.deepEqual(mine.filter((e) => e.type === 'message_sent').map((e) => e.attempt), [1, 2, 3])
  const retrying = mine.filter((e) => e.type === 'message_retrying')
  assert.deepEqual(retrying.map((e) => e.retryCount), [0, 1])
  assert.ok(retrying.every((e) => typeof e.nextRetryAt === 'number' && e.nextRetryAt > 0))
  assert.equal(mine.filter((e) => e.type === 'message_delivered' || e.type === 'message_failed').length, 1)
  assert.equal(await alice.request({ cmd: 'status', id }), 'failed')
})

// A terminal event is released from storage only once the app's listeners ran: one the engine
// dispatched while the JS thread could not run them is emitted again (replayed) after a kill.
test('terminal events committed while the JS thread is blocked reach the app after a kill and restart', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const aliceConfig = peerConfig('alice', dir, relay.url)
  const first = spawnPeer(t, aliceConfig)
  await first.request({ cmd: 'start' })
  await first.waitFor(connected)
  // bob is unknown to the relay until he connects: park first, so the ACKs come after the block.
  const bobKnown = await started(t, peerConfig('bob', dir, relay.url))
  await bobKnown.protocol.stop()
  // Only alice is connected once the relay saw bob leave: the sends find him offline.
  await until(() => relay.stats().connections === 1, { what: 'the relay to see bob leave' })
  const ids = []
  for (let i = 0; i < 3; i++) ids.push(await first.request({ cmd: 'send', recipient: 'bob', content: `m${i}` }))
  await first.waitFor((e) => e.type === 'message_stored' && e.messageId === ids.at(-1))
  await first.request({ cmd: 'block' })

  const bob = await started(t, peerConfig('bob', dir, relay.url))
  // Any later commit (bob's message to alice is one) is what recorded a dispatch so far.
  await bob.protocol.sendMessage('alice', 'after the ACKs')
  const db = new Database(join(dir, 'alice.db'), { readonly: true })
  t.after(() => db.close())
  const settled = () => db.prepare('SELECT COUNT(*) AS n FROM settled').get().n
  const held = () => db.prepare('SELECT COUNT(*) AS n FROM settled WHERE unreported_event IS NOT NULL').get().n
  const processed = () => db.prepare('SELECT COUNT(*) AS n FROM processed').get().n
  await until(() => settled() === 3 && processed() === 1, { timeoutMs: 20_000, what: 'the deliveries and the inbound commit' })
  assert.equal(held(), 3, 'no terminal event may count as reported before a listener ran')
  await first.kill()
  assert.deepEqual(
    first.recorder.events.filter((e) => e.type === 'message_delivered').map((e) => e.messageId),
    [],
    'the blocked JS thread saw nothing',
  )

  const second = spawnPeer(t, aliceConfig)
  await second.request({ cmd: 'start' })
  for (const id of ids) {
    await second.waitFor((e) => e.type === 'message_delivered' && e.messageId === id && e.replayed === true)
  }
  await second.request({ cmd: 'stop' })
})
