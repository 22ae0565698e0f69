// Group benchmark (`node bench/groups.mjs [--members=100] [--rate=N]`, part of `npm run bench:all`): one group message to N members (default 100) through
// a loopback relay, as one relay broadcast with its delivery report, and as per-member fan-out
// (`group.relayBroadcastEnabled: false`). For each: the frames and bytes the relay read (from
// its metrics, by frame type: the sender's frames and the members' acknowledgements), the
// frames it wrote, and the time from `sendGroupMessage` to the last member's `message_received`.
// Figures go to BENCHMARKS.md; this is never part of `npm test`.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { Protocol, Relay, issueToken } from '../js/index.js'

const SECRET = 'bench-secret-0123456789abcdef-0123'
const args = new Map(process.argv.slice(2).map((a) => a.replace(/^--/, '').split('=')))
const MEMBERS = Number(args.get('members') ?? 100)
const ROUNDS = Number(args.get('rounds') ?? 3)
const CONTENT = 'x'.repeat(Number(args.get('bytes') ?? 200))
// `--rate=N`: the relay's per-connection limit, N frames a second (burst 3 N); default its own.
const RATE = args.has('rate') ? Number(args.get('rate')) : null
const dir = mkdtempSync(join(tmpdir(), 'offline-courier-bench-groups-'))

function waitUntil(predicate, what, timeoutMs = 120_000) {
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + timeoutMs
    const tick = () => {
      if (predicate()) return resolve()
      if (Date.now() > deadline) return reject(new Error(`timed out waiting for ${what}`))
      setTimeout(tick, 5)
    }
    tick()
  })
}

async function device(relay, name, extra = {}) {
  const protocol = new Protocol({
    appId: 'bench',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url: relay.url, authToken: issueToken(SECRET, name) } },
    logLevel: 'info',
    ...extra,
  })
  const events = []
  let published = false
  protocol.onEvent((e) => {
    if (e.type === 'diagnostic' && e.message.includes('holds 10 one-time')) published = true
    else if (e.type !== 'diagnostic') events.push(e)
  })
  await protocol.start()
  await waitUntil(() => published, `${name}'s key packages`)
  return { name, protocol, events, address: protocol.localAddress() }
}

/** The relay's counters, by metric and frame type. */
async function metrics(relay) {
  const text = await (await fetch(`http://${relay.metricsAddress}/metrics`)).text()
  const counts = {}
  for (const line of text.split('\n')) {
    const m = /^courier_relay_(frames_received_bytes|frames_received|frames_sent)_total\{type="([^"]+)"\} (\d+)/.exec(line)
    if (m) counts[`${m[1]}:${m[2]}`] = Number(m[3])
  }
  return counts
}

function delta(after, before, prefix) {
  const out = {}
  let total = 0
  for (const [key, value] of Object.entries(after)) {
    if (!key.startsWith(`${prefix}:`)) continue
    const d = value - (before[key] ?? 0)
    if (d === 0) continue
    out[key.slice(prefix.length + 1)] = d
    total += d
  }
  return { total, byType: out }
}

async function sendAndMeasure(relay, sender, groupId, members, round) {
  const content = `${CONTENT} ${sender.name} ${round}`
  const before = await metrics(relay)
  const started = performance.now()
  const id = await sender.protocol.sendGroupMessage(groupId, content)
  let last = 0
  await waitUntil(() => {
    let all = true
    for (const m of members) {
      if (!m.events.some((e) => e.type === 'message_received' && e.content === content)) all = false
    }
    if (all && last === 0) last = performance.now()
    return all
  }, 'every member')
  // The message is settled for every member once the sender knows it (report, or every copy's ACK).
  await waitUntil(() => {
    const settled = new Set(
      sender.events
        .filter((e) => e.type === 'group_message_member_status' && e.messageId === id && e.status !== 'pending')
        .map((e) => e.member),
    )
    return settled.size === members.length
  }, 'every member settled at the sender')
  const after = await metrics(relay)
  return {
    lastMemberMs: last - started,
    read: delta(after, before, 'frames_received'),
    readBytes: delta(after, before, 'frames_received_bytes'),
    written: delta(after, before, 'frames_sent'),
  }
}

async function main() {
  const rateLimit = RATE === null ? {} : { rateLimit: { burst: 3 * RATE, perSec: RATE } }
  const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { memory: true }, jwtSecret: SECRET, metricsListen: '127.0.0.1:0', ...rateLimit })
  const members = []
  for (let i = 0; i < MEMBERS; i++) members.push(await device(relay, `m${i}`))
  const broadcaster = await device(relay, 'broadcaster')
  const fanner = await device(relay, 'fanner', { group: { relayBroadcastEnabled: false } })
  const addresses = members.map((m) => m.address)
  const results = {}
  for (const sender of [broadcaster, fanner]) {
    const groupId = await sender.protocol.createGroup(sender.name, addresses)
    await waitUntil(() => members.every((m) => m.events.some((e) => e.type === 'group_created' && e.groupId === groupId)), 'every member joining')
    if (sender === broadcaster) {
      await waitUntil(() => sender.events.some((e) => e.type === 'group_relay_sync_changed' && e.synced), 'the registration')
    }
    const rounds = []
    for (let round = 0; round < ROUNDS; round++) rounds.push(await sendAndMeasure(relay, sender, groupId, members, round))
    results[sender === broadcaster ? 'broadcast' : 'fan-out'] = rounds
  }
  for (const [path, rounds] of Object.entries(results)) {
    const times = rounds.map((r) => r.lastMemberMs).sort((a, b) => a - b)
    const r = rounds[rounds.length - 1]
    console.log(
      `${path}: ${MEMBERS} members, ${CONTENT.length}-byte content; last member after ${times.map((t) => t.toFixed(0)).join(' / ')} ms; ` +
        `relay read ${r.read.total} frames (${JSON.stringify(r.read.byType)}), ${r.readBytes.total} bytes; wrote ${r.written.total} frames (${JSON.stringify(r.written.byType)})`,
    )
  }
  for (const d of [...members, broadcaster, fanner]) await d.protocol.stop()
  await relay.stop()
}

try {
  await main()
} finally {
  rmSync(dir, { recursive: true, force: true })
}
