// Replies, quotes, mentions, extras and forwards from the public API through a real relay
// (`docs/protocol.md#rich-messages`, `docs/delivery.md#received-messages`): what a message says
// beside its content arrives with it (sealed with it when encryption is on), the 32 KiB cap is
// enforced before anything is queued, and a received message can be forwarded by the id the app
// saw — after a restart, through a durability hook, to a device or a group.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { PLAINTEXT, peerConfig, sealedDevice, startRelay, started, tempDir, waitFor } from './helpers.mjs'

const code = (expected) => (e) => e instanceof ProtocolError && e.code === expected
const receivedAs = (id) => (e) => e.type === 'message_received' && e.messageId === id
const delivered = (id) => (e) => e.type === 'message_delivered' && e.messageId === id
const NONE = { replyTo: null, quote: null, mentions: [], extras: null, forwardInfo: null }
const richOf = ({ replyTo, quote, mentions, extras, forwardInfo }) => ({ replyTo, quote, mentions, extras, forwardInfo })

test('a reply carries its link, quote, mentions and extras, sealed', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await sealedDevice(t, 'alice', dir, relay.url)
  const bob = await sealedDevice(t, 'bob', dir, relay.url)

  const asked = await bob.protocol.sendMessage(alice.address, 'dinner at 8?')
  const question = await waitFor(alice.recorder, receivedAs(asked), { what: 'the question at alice' })
  assert.deepEqual(richOf(question), NONE)

  const extras = { poll: { options: ['yes', 'no'], votes: [1, 0] }, pinned: true, note: 'ünïcode ✓', nothing: null }
  const answered = await alice.protocol.sendMessage(bob.address, 'yes!', {
    replyTo: question.messageId,
    quote: { text: question.content, sender: question.sender, messageId: question.messageId },
    mentions: [bob.address, 'carol'],
    extras,
  })
  const answer = await waitFor(bob.recorder, receivedAs(answered), { what: 'the answer at bob' })
  assert.equal(answer.encrypted, true)
  assert.equal(answer.content, 'yes!')
  assert.deepEqual(richOf(answer), {
    replyTo: asked,
    quote: { text: 'dinner at 8?', sender: bob.address, messageId: asked },
    mentions: [bob.address, 'carol'],
    extras,
    forwardInfo: null,
  })

  // An id the sender chose itself goes on the wire as the wire id its message arrived under.
  await bob.protocol.sendMessage(alice.address, 'one more thing', { id: 'my-own-id' })
  const own = await waitFor(alice.recorder, (e) => e.type === 'message_received' && e.content === 'one more thing')
  const followUp = await bob.protocol.sendMessage(alice.address, 'about that', { replyTo: 'my-own-id', quote: { text: 'one more thing', messageId: 'my-own-id' } })
  const linked = await waitFor(alice.recorder, receivedAs(followUp), { what: 'the follow-up at alice' })
  assert.equal(linked.replyTo, own.messageId)
  assert.deepEqual(linked.quote, { text: 'one more thing', messageId: own.messageId })
})

test('in plaintext mode the reply link rides the relay frame to the recipient', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const bob = await started(t, peerConfig('bob', dir, relay.url))

  const asked = await bob.protocol.sendMessage('alice', 'ping')
  const question = await waitFor(alice.recorder, receivedAs(asked))
  const answered = await alice.protocol.sendMessage('bob', 'pong', { replyTo: question.messageId, mentions: ['bob'] })
  const answer = await waitFor(bob.recorder, receivedAs(answered))
  assert.equal(answer.encrypted, false)
  assert.deepEqual(richOf(answer), { ...NONE, replyTo: asked, mentions: ['bob'] })
})

test("a peer's malformed reply link, rich parts and forward origin are dropped with a warning; its message arrives", async (t) => {
  const dir = tempDir(t)
  const device = await started(t, { appId: 'test', storage: { path: `${dir}/device.db` }, encryption: PLAINTEXT }, { connect: false })
  device.protocol.registerTransport('pipe', { send: async () => {} })
  const frame = {
    id: 'm-1', sender: 'mallory', recipient: device.protocol.localAddress(), app_id: 'test', priority: 'medium',
    ttl: 5, hop_count: 0, timestamp: 1, lamport_clock: 1, content_type: 'text', content: 'still here',
    metadata: {}, requires_ack: true, reply_to_msg: 'a/b', rich: { mentions: 'everyone' }, forwarded_from: { message_id: 'x' },
  }
  device.protocol.receiveFrame('pipe', 'mallory', JSON.stringify(frame))
  const got = await waitFor(device.recorder, receivedAs('m-1'), { what: 'the message without its broken parts' })
  assert.equal(got.content, 'still here')
  assert.deepEqual(richOf(got), NONE)
  const warnings = device.recorder.events.filter((e) => e.type === 'diagnostic' && e.level === 'warn' && e.message.includes('m-1'))
  assert.deepEqual(
    warnings.map((e) => ['reply_to_msg', 'rich', 'forwarded_from'].find((part) => e.message.includes(`(${part}`))),
    ['reply_to_msg', 'rich', 'forwarded_from'],
  )
})

test('quote, mentions and extras are capped at 32 KiB; a refused send changes nothing', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  // `{"extras":{"k":"…"}}`: the text and 19 bytes around it.
  const extrasOf = (bytes) => ({ k: 'x'.repeat(bytes - 19) })

  const fits = await alice.protocol.sendMessage('bob', 'at the cap', { extras: extrasOf(32_768) })
  const got = await waitFor(bob.recorder, receivedAs(fits), { what: 'the message at the cap' })
  assert.equal(got.extras.k.length, 32_768 - 19)
  await waitFor(alice.recorder, delivered(fits))

  const before = alice.protocol.stats()
  const seen = alice.recorder.events.length
  await assert.rejects(
    alice.protocol.sendMessage('bob', 'over', { id: 'over-the-cap', extras: extrasOf(32_769) }),
    (e) => code('ERR_INVALID_ARGUMENT')(e) && /32769 bytes/.test(e.message) && /32768/.test(e.message),
  )
  const cycle = {}
  cycle.self = cycle
  const refused = [
    { mentions: ['bob', 'bob'] },
    { mentions: Array.from({ length: 257 }, (_, i) => `peer-${i}`) },
    { mentions: [''] },
    { mentions: 'bob' },
    { replyTo: '' },
    { replyTo: 7 },
    { quote: { sender: 'bob' } },
    { quote: { text: 'x', author: 'bob' } },
    { quote: { text: 'x', messageId: 'a/b' } },
    { extras: [] },
    { extras: new Map() },
    { extras: { at: new Date() } },
    { extras: { n: Number.NaN } },
    { extras: { f: () => {} } },
    { extras: { u: undefined } },
    { extras: cycle },
  ]
  for (const [n, options] of refused.entries()) {
    await assert.rejects(alice.protocol.sendMessage('bob', 'x', options), code('ERR_INVALID_ARGUMENT'), `refused[${n}]`)
  }
  // The whole message, content and rich parts together, stays under 256 KiB.
  await assert.rejects(
    alice.protocol.sendMessage('bob', 'c'.repeat(256 * 1024 - 50), { extras: { k: 'x'.repeat(100) } }),
    (e) => code('ERR_INVALID_ARGUMENT')(e) && /262144/.test(e.message),
  )
  assert.deepEqual(alice.protocol.stats(), before)
  assert.equal(await alice.protocol.getMessageStatus('over-the-cap'), 'unknown')

  // Events come in order: once a later send settled, nothing of the refused ones can follow.
  const after = await alice.protocol.sendMessage('bob', 'after')
  await waitFor(alice.recorder, delivered(after))
  const stray = alice.recorder.events.slice(seen).filter((e) => e.messageId !== undefined && e.messageId !== after)
  assert.deepEqual(stray, [])
  assert.ok(!bob.recorder.events.some((e) => e.type === 'message_received' && e.content !== 'at the cap' && e.content !== 'after'))
})

test('a received message is forwarded with its origin, also from a forward, after a restart and through the hook', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const hooked = []
  const alice = await sealedDevice(t, 'alice', dir, relay.url)
  const bob = await sealedDevice(t, 'bob', dir, relay.url)
  const carol = await sealedDevice(t, 'carol', dir, relay.url, {
    inboundDurabilityHook: async (batch) => {
      hooked.push(...batch)
    },
  })

  const extras = { album: 'summer', n: 3 }
  const sent = await alice.protocol.sendMessage(bob.address, new Uint8Array([1, 2, 3]), {
    contentType: 'image',
    metadata: { name: 'beach.png' },
    quote: { text: 'the photo?' },
    mentions: [carol.address],
    extras,
  })
  const original = await waitFor(bob.recorder, receivedAs(sent), { what: 'the photo at bob' })

  const first = await bob.protocol.forwardMessage(original.messageId, carol.address)
  const atCarol = await waitFor(carol.recorder, receivedAs(first), { what: 'the forward at carol' })
  const origin = { messageId: sent, sender: alice.address, timestamp: original.timestamp, chat: alice.address }
  assert.equal(atCarol.sender, bob.address)
  assert.deepEqual(atCarol.content, new Uint8Array([1, 2, 3]))
  assert.equal(atCarol.contentType, 'image')
  assert.deepEqual(atCarol.metadata, { name: 'beach.png' })
  assert.deepEqual(richOf(atCarol), {
    replyTo: null,
    quote: { text: 'the photo?' },
    mentions: [carol.address],
    extras,
    forwardInfo: { ...origin, forwardCount: 1 },
  })
  await bob.protocol.whenDelivered(first)
  // The hook was handed the same fields.
  const batched = hooked.find((m) => m.messageId === first)
  assert.deepEqual(richOf(batched), richOf(atCarol))

  // A forward of the forward keeps the first origin and counts one more.
  const second = await carol.protocol.forwardMessage(atCarol.messageId, alice.address, { priority: 'high' })
  const atAlice = await waitFor(alice.recorder, receivedAs(second), { what: 'the second forward at alice' })
  assert.equal(atAlice.sender, carol.address)
  assert.deepEqual(atAlice.forwardInfo, { ...origin, forwardCount: 2 })
  assert.deepEqual(atAlice.extras, extras)

  // Only what this device received can be forwarded.
  await assert.rejects(bob.protocol.forwardMessage('no-such-message', carol.address), code('ERR_MESSAGE_NOT_FOUND'))
  await assert.rejects(bob.protocol.forwardMessage(first, carol.address), code('ERR_MESSAGE_NOT_FOUND'))
  await assert.rejects(bob.protocol.forwardMessage(original.messageId, 'not-an-address'), code('ERR_INVALID_ARGUMENT'))
  await assert.rejects(bob.protocol.forwardMessage(original.messageId, carol.address, { via: 'x' }), code('ERR_INVALID_ARGUMENT'))

  // The received message outlives a restart.
  await bob.protocol.stop()
  const bobAgain = await started(t, bob.config)
  const third = await bobAgain.protocol.forwardMessage(original.messageId, carol.address)
  const again = await waitFor(carol.recorder, receivedAs(third), { what: 'the forward after the restart' })
  assert.deepEqual(again.forwardInfo, { ...origin, forwardCount: 1 })
})

test('group messages carry rich parts, and forwards go into and out of a group', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await sealedDevice(t, 'alice', dir, relay.url)
  const bob = await sealedDevice(t, 'bob', dir, relay.url)
  const groupId = await alice.protocol.createGroup('friends', [bob.address])
  await waitFor(bob.recorder, (e) => e.type === 'group_created' && e.groupId === groupId, { what: 'bob joining' })
  await waitFor(alice.recorder, (e) => e.type === 'group_relay_sync_changed' && e.groupId === groupId && e.synced, {
    what: 'the relay registration',
  })

  const direct = await alice.protocol.sendMessage(bob.address, 'just for you')
  await waitFor(bob.recorder, receivedAs(direct), { what: 'the direct message at bob' })
  const posted = await alice.protocol.sendGroupMessage(groupId, 'hello all', {
    replyTo: direct,
    mentions: [bob.address],
    extras: { topic: 'plans' },
  })
  const inGroup = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.groupId === groupId, {
    what: 'the group message at bob',
  })
  assert.equal(inGroup.content, 'hello all')
  assert.deepEqual(richOf(inGroup), { ...NONE, replyTo: direct, mentions: [bob.address], extras: { topic: 'plans' } })
  assert.equal(typeof posted, 'string')

  // Out of the group: the origin's chat is the group.
  const out = await bob.protocol.forwardMessage(inGroup.messageId, alice.address)
  const outAtAlice = await waitFor(alice.recorder, receivedAs(out), { what: 'the forward out of the group' })
  assert.equal(outAtAlice.groupId, undefined)
  assert.deepEqual(outAtAlice.forwardInfo, {
    messageId: inGroup.messageId,
    sender: alice.address,
    timestamp: inGroup.timestamp,
    chat: groupId,
    forwardCount: 1,
  })

  // Into the group: a forward to a group this device is in is a group message.
  await waitFor(bob.recorder, (e) => e.type === 'group_relay_sync_changed' && e.groupId === groupId && e.synced)
  await bob.protocol.forwardMessage(direct, groupId)
  const inAtAlice = await waitFor(alice.recorder, (e) => e.type === 'message_received' && e.groupId === groupId && e.forwardInfo !== null, {
    what: 'the forward into the group',
  })
  assert.equal(inAtAlice.content, 'just for you')
  assert.equal(inAtAlice.forwardInfo.chat, alice.address)
})
