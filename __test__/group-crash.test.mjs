// The group tracker survives a crash (`docs/delivery.md#group-tracker`): the sender is killed
// with SIGKILL the moment its group message is committed and broadcast, inside the window where
// the relay's report is awaited; after the restart every member has the message exactly once,
// and the sender's status shows every member delivered.
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { test } from 'node:test'

import { PeerProcess, keyPackagesPublished, sealedConfig, sealedDevice, startRelay, tempDir, until, waitFor } from './helpers.mjs'

test('a sender killed between its broadcast and the report still reaches every member exactly once', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const bob = await sealedDevice(t, 'bob', dir, relay.url)
  const carol = await sealedDevice(t, 'carol', dir, relay.url)
  const marker = join(dir, 'died')
  const config = sealedConfig('alice', dir, relay.url)

  const alice = new PeerProcess(config, { PEER_DIE_ON_GROUP_SENT: marker })
  t.after(() => alice.kill())
  await alice.request({ cmd: 'start' })
  await alice.waitFor(keyPackagesPublished, { what: "alice's key packages" })
  const groupId = await alice.request({ cmd: 'createGroup', name: 'crash', members: [bob.address, carol.address] })
  for (const peer of [bob, carol]) {
    await waitFor(peer.recorder, (e) => e.type === 'group_created' && e.groupId === groupId, { what: `${peer.name} joining` })
  }
  await alice.waitFor((e) => e.type === 'group_relay_sync_changed' && e.synced, { what: 'the relay registration' })

  // No reply comes: the process dies as the send is reported.
  alice.child.stdin.write(`${JSON.stringify({ cmd: 'sendGroup', groupId, content: 'survives a kill', options: { id: 'kill-1' }, nonce: 'x' })}\n`)
  const { signal } = await alice.exited
  assert.equal(signal, 'SIGKILL')

  const again = new PeerProcess(config)
  t.after(() => again.kill())
  await again.request({ cmd: 'start' })
  const got = (peer) => peer.recorder.events.filter((e) => e.type === 'message_received' && e.groupId === groupId && e.content === 'survives a kill')
  for (const peer of [bob, carol]) await until(() => got(peer).length > 0, { timeoutMs: 20_000, what: `the message at ${peer.name}` })
  const settled = (status) => status !== null && Object.values(status.members).every((s) => s === 'delivered' || s === 'stored')
  const deadline = Date.now() + 20_000
  let status = await again.request({ cmd: 'groupStatus', id: 'kill-1' })
  while (!settled(status)) {
    assert.ok(Date.now() < deadline, `every member settled in alice's status; last ${JSON.stringify(status)}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
    status = await again.request({ cmd: 'groupStatus', id: 'kill-1' })
  }
  assert.deepEqual(Object.keys(status.members).sort(), [bob.address, carol.address].sort())
  // Whatever reached them twice (the broadcast and a backstop copy) was deduplicated.
  for (const peer of [bob, carol]) assert.equal(got(peer).length, 1, `${peer.name} got it once`)
})
