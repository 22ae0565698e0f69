// A 200-member group over a real relay whose rate limit is tight (15 frames a second per
// connection): the admin's setup and a fan-out of 200 copies are paced by the client's token bucket
// and never hit the limit, and no copy is sent twice, although the tail of the fan-out is written
// long after the 10 s ACK timeout — its timer starts when the copy is written
// (`docs/delivery.md#large-groups`). The broadcast reaches all 200 at once.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Protocol } from '../js/index.js'
import { startRelay, token, until } from './helpers.mjs'

const MEMBERS = 200

async function metrics(relay) {
  const text = await (await fetch(`http://${relay.metricsAddress}/metrics`)).text()
  const total = (name, type) => {
    const m = new RegExp(`^courier_relay_${name}_total\\{type="${type}"\\} (\\d+)$`, 'm').exec(text)
    return m ? Number(m[1]) : 0
  }
  const limited = [...text.matchAll(/^courier_relay_rate_limited_frames_total\{[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0)
  return { sendMessage: total('frames_received', 'SendMessage'), limited }
}

test(`a ${MEMBERS}-member group: paced under the relay's limit, nothing sent twice, nobody missed`, { timeout: 600_000 }, async (t) => {
  // Low enough that the admin's Welcomes and copies must be paced: a Welcome for 200 members is
  // tens of KiB, paid a token per started 4 KiB (docs/protocol.md#rate-limiting).
  const relay = await startRelay(t, { rateLimit: { burst: 600, perSec: 300 }, metricsListen: '127.0.0.1:0' })
  const devices = []
  const device = async (name, extra = {}) => {
    const protocol = new Protocol({
      appId: 'test',
      storage: { memory: true },
      transports: { internet: { url: relay.url, authToken: token(name) } },
      logLevel: 'info',
      ...extra,
    })
    const d = { name, protocol, received: new Map(), created: new Set(), published: false, events: [] }
    protocol.onEvent((e) => {
      if (e.type === 'diagnostic') {
        if (e.message.includes('holds 10 one-time')) d.published = true
        return
      }
      if (e.type === 'message_received' && e.groupId) d.received.set(e.content, (d.received.get(e.content) ?? 0) + 1)
      if (e.type === 'group_created') d.created.add(e.groupId)
      d.events.push(e)
    })
    await protocol.start()
    t.after(() => protocol.stop())
    devices.push(d)
    return d
  }
  const admin = await device('admin')
  const members = []
  for (let i = 0; i < MEMBERS; i++) members.push(await device(`m${i}`, i === 0 ? { group: { relayBroadcastEnabled: false } } : {}))
  await until(() => devices.every((d) => d.published), { timeoutMs: 120_000, what: "every device's key packages" })
  const addresses = members.map((m) => m.protocol.localAddress())

  const groupId = await admin.protocol.createGroup('large', addresses)
  await until(() => members.every((m) => m.created.has(groupId)), { timeoutMs: 180_000, what: 'every member joining' })
  await until(() => admin.events.some((e) => e.type === 'group_relay_sync_changed' && e.synced), {
    timeoutMs: 120_000,
    what: 'the relay registration',
  })

  // One broadcast: every member has it, and the report accounts for every one of them.
  const broadcast = await admin.protocol.sendGroupMessage(groupId, 'to all, at once')
  await until(() => members.every((m) => m.received.get('to all, at once') === 1), { timeoutMs: 60_000, what: 'the broadcast everywhere' })
  await until(() => admin.events.some((e) => e.type === 'group_message_delivery_report' && e.messageId === broadcast), {
    timeoutMs: 60_000,
    what: 'the report',
  })
  const report = admin.events.find((e) => e.type === 'group_message_delivery_report' && e.messageId === broadcast)
  assert.equal(report.delivered.length, MEMBERS)
  assert.deepEqual(report.missedReissued, [])

  // A fan-out of 200 copies from a member whose app turned the broadcast off: at 15 frames a
  // second the last copy is written ~13 s after the first, past the 10 s ACK timeout.
  const before = await metrics(relay)
  const fanner = members[0]
  const fanned = await fanner.protocol.sendGroupMessage(groupId, 'one copy each')
  const isSent = (e) => e.type === 'group_message_sent' && e.messageId === fanned
  await until(() => fanner.events.some(isSent), { what: 'group_message_sent' })
  const sent = fanner.events.find(isSent)
  assert.deepEqual([sent.path, sent.members], ['fanout', MEMBERS])
  const others = [admin, ...members.slice(1)]
  await until(() => others.every((d) => d.received.get('one copy each') === 1), { timeoutMs: 120_000, what: 'every copy delivered' })
  let status = await fanner.protocol.getGroupMessageStatus(fanned)
  const deadline = Date.now() + 60_000
  while (!Object.values(status.members).every((s) => s === 'delivered')) {
    assert.ok(Date.now() < deadline, `every member delivered at the sender: ${JSON.stringify(status.members)}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
    status = await fanner.protocol.getGroupMessageStatus(fanned)
  }
  assert.equal(Object.keys(status.members).length, MEMBERS)
  const after = await metrics(relay)
  // Each copy went once and was acknowledged once: a copy retransmitted before it was written
  // (or at all) would add a second copy and a second ACK.
  assert.equal(after.sendMessage - before.sendMessage, 2 * MEMBERS, 'copies and their ACKs, each once')
  assert.equal(after.limited, 0, "nothing ever hit the relay's rate limit")
  for (const d of [admin, ...members]) {
    for (const [content, n] of d.received) assert.equal(n, 1, `${content} reached ${d.name} ${n} times`)
  }
})
