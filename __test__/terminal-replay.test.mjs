// A terminal event is never lost to a kill: it is released from storage only once the app's
// listeners have run, so one the engine dispatched while the JS thread could not run them is
// emitted again (replayed) after the restart.
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { test } from 'node:test'

import Database from 'better-sqlite3'

import { PeerProcess, connected, peerConfig, startRelay, started, tempDir, until } from './helpers.mjs'

function spawnPeer(t, config) {
  const peer = new PeerProcess(config)
  t.after(() => peer.kill())
  return peer
}

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
