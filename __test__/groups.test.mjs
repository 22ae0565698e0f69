// Groups from the public API over a real relay (`docs/delivery.md#group-sends`): an MLS group
// per chat group, created and changed by its admin, group messages broadcast by the relay with a
// delivery report, every member's state kept for `getGroupMessageStatus`.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { peerConfig, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

/** A sealed device (the default), with the diagnostics that say its key packages are published. */
async function device(t, name, dir, url, extra = {}) {
  const { encryption, ...config } = peerConfig(name, dir, url, { logLevel: 'info', ...extra })
  void encryption
  const peer = await started(t, config)
  await waitFor(peer.recorder, (e) => e.type === 'diagnostic' && e.message.includes('holds 10 one-time'), {
    what: `${name}'s key packages in the directory`,
  })
  return { ...peer, name, config, address: peer.protocol.localAddress() }
}

/** A relay, and a sealed device on it for each of `names`. */
async function world(t, ...names) {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const peers = []
  for (const name of names) peers.push(await device(t, name, dir, relay.url))
  return { dir, relay, peers }
}

const received = (groupId, content) => (e) =>
  e.type === 'message_received' && e.groupId === groupId && e.content === content

/** Resolves once every one of `peers` received `content` in the group, once. */
async function allReceive(peers, groupId, content) {
  for (const peer of peers) {
    const got = await waitFor(peer.recorder, received(groupId, content), { what: `${content} at ${peer.name}` })
    assert.equal(got.chat, groupId)
    assert.equal(got.encrypted, true)
  }
}

const count = (peer, groupId, content) => peer.recorder.events.filter(received(groupId, content)).length

test('a five-member group: create, send both ways, add, remove, leave', async (t) => {
  const {
    peers: [alice, bob, carol, dave, erin],
  } = await world(t, 'alice', 'bob', 'carol', 'dave', 'erin')

  const groupId = await alice.protocol.createGroup('friends', [bob.address, carol.address, dave.address])
  const created = await waitFor(alice.recorder, (e) => e.type === 'group_created' && e.groupId === groupId)
  assert.equal(created.name, 'friends')
  assert.equal(created.admin, alice.address)
  for (const member of [bob, carol, dave]) {
    const joined = await waitFor(member.recorder, (e) => e.type === 'group_created' && e.groupId === groupId, {
      what: `${member.name} joining`,
    })
    assert.equal(joined.admin, alice.address)
    assert.deepEqual(joined.members, [alice.address, bob.address, carol.address, dave.address].sort())
  }
  await waitFor(alice.recorder, (e) => e.type === 'group_relay_sync_changed' && e.groupId === groupId && e.synced, {
    what: 'the relay registration',
  })

  // The admin's message goes as one broadcast; the report accounts for every member.
  const first = await alice.protocol.sendGroupMessage(groupId, 'hello friends')
  const sent = await waitFor(alice.recorder, (e) => e.type === 'group_message_sent' && e.messageId === first)
  assert.deepEqual([sent.path, sent.members], ['relay', 3])
  await allReceive([bob, carol, dave], groupId, 'hello friends')
  const report = await waitFor(alice.recorder, (e) => e.type === 'group_message_delivery_report' && e.messageId === first, {
    what: 'the delivery report',
  })
  assert.deepEqual([...report.delivered].sort(), [bob.address, carol.address, dave.address].sort())
  assert.deepEqual(report.missedReissued, [])
  const status = await alice.protocol.getGroupMessageStatus(first)
  assert.equal(status.groupId, groupId)
  assert.deepEqual(status.members, { [bob.address]: 'delivered', [carol.address]: 'delivered', [dave.address]: 'delivered' })

  // A member's message reaches the admin and the others.
  await waitFor(bob.recorder, (e) => e.type === 'group_relay_sync_changed' && e.groupId === groupId && e.synced)
  await bob.protocol.sendGroupMessage(groupId, 'hi from bob', { metadata: { mood: 'glad' } })
  await allReceive([alice, carol, dave], groupId, 'hi from bob')
  const fromBob = alice.recorder.events.find(received(groupId, 'hi from bob'))
  assert.equal(fromBob.sender, bob.address)
  assert.deepEqual(fromBob.metadata, { mood: 'glad' })

  // A member added later reads what comes after, never what came before.
  await alice.protocol.addGroupMember(groupId, erin.address)
  await waitFor(erin.recorder, (e) => e.type === 'group_created' && e.groupId === groupId, { what: 'erin joining' })
  for (const member of [alice, bob, carol, dave]) {
    await waitFor(member.recorder, (e) => e.type === 'group_member_added' && e.member === erin.address, {
      what: `erin's arrival at ${member.name}`,
    })
  }
  await alice.protocol.sendGroupMessage(groupId, 'welcome erin')
  await allReceive([bob, carol, dave, erin], groupId, 'welcome erin')
  assert.equal(count(erin, groupId, 'hello friends'), 0)
  assert.equal(count(erin, groupId, 'hi from bob'), 0)

  // A removed member cannot read anything sent afterwards.
  await alice.protocol.removeGroupMember(groupId, dave.address)
  await waitFor(dave.recorder, (e) => e.type === 'group_member_removed' && e.member === dave.address, { what: 'dave removed' })
  await alice.protocol.sendGroupMessage(groupId, 'after dave')
  await allReceive([bob, carol, erin], groupId, 'after dave')
  assert.equal(count(dave, groupId, 'after dave'), 0)
  assert.ok(!(await dave.protocol.listGroups()).some((g) => g.groupId === groupId))

  // A member leaves: the admin commits its removal, and it reads nothing afterwards.
  await carol.protocol.leaveGroup(groupId)
  await waitFor(alice.recorder, (e) => e.type === 'group_member_removed' && e.member === carol.address, { what: 'carol gone at alice' })
  await alice.protocol.sendGroupMessage(groupId, 'after carol')
  await allReceive([bob, erin], groupId, 'after carol')
  assert.equal(count(carol, groupId, 'after carol'), 0)

  const [group] = await alice.protocol.listGroups()
  assert.deepEqual(group.members, [alice.address, bob.address, erin.address].sort())
  assert.equal(group.admin, alice.address)
  for (const peer of [alice, bob, carol, dave, erin]) {
    for (const content of ['hello friends', 'hi from bob', 'welcome erin', 'after dave', 'after carol']) {
      assert.ok(count(peer, groupId, content) <= 1, `${content} reached ${peer.name} twice`)
    }
  }
})

test('group calls refuse what they cannot do, changing nothing', async (t) => {
  const {
    dir,
    relay,
    peers: [alice, bob],
  } = await world(t, 'alice', 'bob')
  const code = (expected) => (e) => e instanceof ProtocolError && e.code === expected

  await assert.rejects(alice.protocol.sendGroupMessage('no-such-group', 'x'), code('ERR_GROUP_NOT_FOUND'))
  await assert.rejects(alice.protocol.createGroup('g', ['not-an-address']), code('ERR_INVALID_ARGUMENT'))
  await assert.rejects(alice.protocol.createGroup('g', [alice.address]), code('ERR_INVALID_ARGUMENT'))
  await assert.rejects(alice.protocol.createGroup('', [bob.address]), code('ERR_INVALID_ARGUMENT'))
  // A bidi override would make 'Team \u202Enimda' read as 'Team admin'.
  await assert.rejects(alice.protocol.createGroup('Team \u202Enimda', [bob.address]), code('ERR_INVALID_ARGUMENT'))
  const groupId = await alice.protocol.createGroup('pair', [bob.address])
  await waitFor(bob.recorder, (e) => e.type === 'group_created' && e.groupId === groupId)
  await assert.rejects(bob.protocol.addGroupMember(groupId, alice.address), code('ERR_GROUP_NOT_ADMIN'))
  await assert.rejects(alice.protocol.leaveGroup(groupId), code('ERR_INVALID_ARGUMENT'))
  await assert.rejects(alice.protocol.sendGroupMessage(groupId, '__MLS_ENC__x'), code('ERR_INVALID_ARGUMENT'))
  assert.equal(await alice.protocol.getGroupMessageStatus('never-sent'), null)

  // The same id twice is one message.
  const id = await alice.protocol.sendGroupMessage(groupId, 'once', { id: 'fixed-id' })
  await waitFor(bob.recorder, received(groupId, 'once'))
  assert.equal(await alice.protocol.sendGroupMessage(groupId, 'once', { id: 'fixed-id' }), id)

  // Not held to sendMessage's 256 KiB cap, only to the frame its sealed form must fit.
  const big = 'b'.repeat(300 * 1024)
  await assert.rejects(alice.protocol.sendMessage(bob.address, big), code('ERR_INVALID_ARGUMENT'))
  await alice.protocol.sendGroupMessage(groupId, big)
  await waitFor(bob.recorder, received(groupId, big), { what: 'the 300 KiB group message' })
  await assert.rejects(alice.protocol.sendGroupMessage(groupId, 'c'.repeat(900 * 1024)), code('ERR_INVALID_ARGUMENT'))

  // Groups are MLS groups: a plaintext device has none.
  const plain = await started(t, peerConfig('plain', dir, relay.url))
  await assert.rejects(plain.protocol.createGroup('g', [bob.address]), code('ERR_ENCRYPTION_REQUIRED'))
  assert.equal(count(bob, groupId, 'once'), 1)
})

test('a broadcast with a member offline: reported stored, received on its return, once', async (t) => {
  const {
    relay,
    peers: [alice, bob, carol],
  } = await world(t, 'alice', 'bob', 'carol')
  const groupId = await alice.protocol.createGroup('offline', [bob.address, carol.address])
  await waitFor(carol.recorder, (e) => e.type === 'group_created' && e.groupId === groupId)
  await waitFor(alice.recorder, (e) => e.type === 'group_relay_sync_changed' && e.groupId === groupId && e.synced)
  await carol.protocol.stop()
  await until(() => relay.stats().connections === 2, { what: 'the relay to see carol leave' })

  const id = await alice.protocol.sendGroupMessage(groupId, 'while carol is away')
  const report = await waitFor(alice.recorder, (e) => e.type === 'group_message_delivery_report' && e.messageId === id, {
    what: 'the delivery report',
  })
  assert.deepEqual(report.delivered, [bob.address])
  assert.deepEqual(report.pushed, [carol.address])
  assert.deepEqual(report.missedReissued, [])
  assert.deepEqual((await alice.protocol.getGroupMessageStatus(id)).members, { [bob.address]: 'delivered', [carol.address]: 'stored' })
  await waitFor(bob.recorder, received(groupId, 'while carol is away'))

  const back = await started(t, carol.config)
  const again = { ...carol, ...back }
  await waitFor(again.recorder, received(groupId, 'while carol is away'), { what: 'the message at carol after her return' })
  await waitFor(again.recorder, (e) => e.type === 'inbound_drain_completed')
  assert.equal(count(again, groupId, 'while carol is away'), 1)
  assert.equal(count(bob, groupId, 'while carol is away'), 1)
})

test('with a durability hook, a group message is offered with its group and acknowledged once committed', async (t) => {
  const {
    dir,
    relay,
    peers: [alice],
  } = await world(t, 'alice')
  const batches = []
  const bob = await device(t, 'bob', dir, relay.url, {
    inboundDurabilityHook: async (batch) => {
      batches.push(batch)
    },
  })
  const groupId = await alice.protocol.createGroup('hooked', [bob.address])
  await waitFor(bob.recorder, (e) => e.type === 'group_created' && e.groupId === groupId)
  const id = await alice.protocol.sendGroupMessage(groupId, 'kept by the app', { metadata: { k: 'v' } })
  await waitFor(bob.recorder, received(groupId, 'kept by the app'))
  const offered = batches.flat().find((m) => m.content === 'kept by the app')
  assert.equal(offered.groupId, groupId)
  assert.equal(offered.chat, groupId)
  assert.equal(offered.sender, alice.address)
  assert.deepEqual(offered.metadata, { k: 'v' })
  await waitFor(alice.recorder, (e) => e.type === 'group_message_member_status' && e.messageId === id && e.status === 'delivered')
})
