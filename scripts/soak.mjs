// A soak under attack (`npm run soak`): honest clients deliver through a real relay while abusive
// ones do everything `docs/operating-the-relay.md#limits-under-abuse` and
// `docs/protocol.md#authentication-limits` guard against, all at once. The same honest load runs
// first alone, then under attack, on the same relay; the report compares the two runs' delivery
// rate and send→ACK latency, and gives the relay's resident memory. Loopback only.
//
//   node scripts/soak.mjs [--seconds=60] [--pairs=10] [--rate=200] [--attacks=a,b] [--json]
import { fork, spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

import { Protocol, issueToken } from '../js/index.js'

const here = (path) => fileURLToPath(new URL(path, import.meta.url))
const SECRET = 'soak-secret-0123456789abcdef-0123456789'
const ATTACKERS = ['mallory-fill', 'mallory-watch', 'mallory-churn', 'mallory-sink']

function rssBytes(pid) {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024
}

const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0

/** The relay command, journaling to `dir`, limits at their defaults; resolves with its url. */
async function startRelay(dir) {
  const secretFile = join(dir, 'secret')
  writeFileSync(secretFile, SECRET)
  const args = ['--import', pathToFileURL(here('./soak/exit-with-parent.mjs')).href, here('../js/relay-cli.js')]
  // Attackers connect from other loopback addresses: the per-source limits apply to them.
  args.push('--listen', '127.0.0.1:0', '--jwt-secret-file', secretFile, '--db', join(dir, 'relay.db'), '--limit-loopback', '--log-level', 'error')
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  const line = await new Promise((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', resolve)
    child.once('exit', (code) => reject(new Error(`the relay exited with ${code}`)))
  })
  return { child, url: line.slice(line.indexOf('ws://')) }
}

/** `pairs` senders and recipients, each a `Protocol` with its own store. */
async function honestClients(dir, url, pairs) {
  const make = async (account) => {
    const p = new Protocol({
      appId: 'soak',
      storage: { path: join(dir, `${account}.db`) },
      transports: { internet: { url, authToken: issueToken(SECRET, account) } },
      encryption: { enabled: false },
    })
    const up = new Promise((resolve) => p.onEvent((e) => e.type === 'internet_status_changed' && e.authenticated && resolve()))
    await p.start()
    await up
    return p
  }
  const senders = await Promise.all(Array.from({ length: pairs }, (_, i) => make(`honest-s${i}`)))
  const recipients = await Promise.all(Array.from({ length: pairs }, (_, i) => make(`honest-r${i}`)))
  return { senders, recipients, stop: () => Promise.all([...senders, ...recipients].map((p) => p.stop())) }
}

/**
 * Offers `rate` messages a second, spread over the pairs, for `seconds`; then waits (up to
 * `drainSeconds`) for every ACK. A message counts once its `message_delivered` arrived.
 */
async function honestRun({ senders }, { rate, seconds, drainSeconds, label, sampleRss }) {
  const sentAt = new Map()
  const latencies = []
  let failed = 0
  const off = senders.map((p) =>
    p.onEvent((e) => {
      if (e.type === 'message_delivered' && sentAt.has(e.messageId)) {
        latencies.push(performance.now() - sentAt.get(e.messageId))
        sentAt.delete(e.messageId)
      } else if (e.type === 'message_failed' && sentAt.has(e.messageId)) {
        failed++
        sentAt.delete(e.messageId)
      }
    }),
  )
  const total = Math.round(rate * seconds)
  const started = performance.now()
  let issued = 0
  let rss = 0
  await new Promise((resolve) => {
    const pacer = setInterval(() => {
      rss = Math.max(rss, sampleRss())
      const due = Math.min(total, Math.floor(((performance.now() - started) * rate) / 1000))
      while (issued < due) {
        const i = issued % senders.length
        const id = `${label}-${issued++}`
        sentAt.set(id, performance.now())
        senders[i].sendMessage(`honest-r${i}`, `honest message ${id}`, { id }).catch((e) => {
          console.error(`send ${id} refused: ${e.message}`)
          failed++
          sentAt.delete(id)
        })
      }
      if (issued === total) {
        clearInterval(pacer)
        resolve()
      }
    }, 5)
  })
  const offeredFor = (performance.now() - started) / 1000
  const drainUntil = performance.now() + drainSeconds * 1000
  while (sentAt.size > 0 && performance.now() < drainUntil) {
    rss = Math.max(rss, sampleRss())
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  for (const stop of off) stop()
  latencies.sort((a, b) => a - b)
  return {
    offered: total,
    delivered: latencies.length,
    failed,
    lost: sentAt.size,
    perSecond: latencies.length / Math.max(offeredFor, (performance.now() - started) / 1000),
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    relayRssMax: rss,
  }
}

/** Every attack of `soak/attacker.mjs`, each in its own process. */
const ATTACKS = ['unauthenticated', 'guesser', 'oversized', 'filler', 'watcher', 'churn', 'sink']

function startAttackers(url, victims, attacks) {
  const tokens = Object.fromEntries(ATTACKERS.map((a) => [a, issueToken(SECRET, a)]))
  const children = attacks.map((attack) =>
    fork(here('./soak/attacker.mjs'), [JSON.stringify({ attack, url, tokens, victims })], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }),
  )
  const stopped = (child) =>
    new Promise((resolve) => {
      child.once('message', ({ counts }) => resolve(counts))
      child.once('exit', () => resolve({}))
      child.send({ cmd: 'stop' })
    })
  return {
    stop: async () => Object.assign({}, ...(await Promise.all(children.map(stopped)))),
  }
}

/**
 * One soak: the honest load alone, then under attack, on one relay. `seconds` per run;
 * `drainSeconds` the most each run waits for its last ACKs.
 */
export async function soak({ seconds = 60, pairs = 10, rate = 200, drainSeconds = 60, attacks = ATTACKS } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'courier-soak-'))
  const relay = await startRelay(dir)
  const sampleRss = () => rssBytes(relay.child.pid)
  try {
    const clients = await honestClients(dir, relay.url, pairs)
    try {
      const rssIdle = sampleRss()
      const alone = await honestRun(clients, { rate, seconds, drainSeconds, label: 'alone', sampleRss })
      const attackers = startAttackers(relay.url, Array.from({ length: pairs }, (_, i) => `honest-r${i}`), attacks)
      // The attack is under way before the honest load starts again.
      await new Promise((resolve) => setTimeout(resolve, 1000))
      const attacked = await honestRun(clients, { rate, seconds, drainSeconds, label: 'attacked', sampleRss })
      const counts = await attackers.stop()
      return { seconds, pairs, rate, rssIdle, alone, attacked, attacks: counts }
    } finally {
      await clients.stop()
    }
  } finally {
    relay.child.stdin.end()
    await new Promise((resolve) => (relay.child.exitCode !== null ? resolve() : relay.child.once('exit', resolve)))
    rmSync(dir, { recursive: true, force: true })
  }
}

function report(r) {
  const mib = (b) => `${(b / 2 ** 20).toFixed(1)} MiB`
  const ms = (v) => `${v.toFixed(2)} ms`
  const ratio = (a, b) => (b > 0 ? `${(a / b).toFixed(2)}×` : '—')
  const lines = [
    `soak: ${r.pairs} honest pairs offering ${r.rate} msg/s for ${r.seconds} s, alone then under attack`,
    '',
    '| measure | alone | under attack | attack ÷ alone |',
    '| --- | --- | --- | --- |',
    `| honest delivered msg/s | ${r.alone.perSecond.toFixed(0)} | ${r.attacked.perSecond.toFixed(0)} | ${ratio(r.attacked.perSecond, r.alone.perSecond)} |`,
    `| honest send→ACK p50 | ${ms(r.alone.p50)} | ${ms(r.attacked.p50)} | ${ratio(r.attacked.p50, r.alone.p50)} |`,
    `| honest send→ACK p99 | ${ms(r.alone.p99)} | ${ms(r.attacked.p99)} | ${ratio(r.attacked.p99, r.alone.p99)} |`,
    `| honest messages lost (offered, not ACKed, not failed) | ${r.alone.lost} of ${r.alone.offered} | ${r.attacked.lost} of ${r.attacked.offered} | |`,
    `| honest messages failed | ${r.alone.failed} | ${r.attacked.failed} | |`,
    `| relay RSS, highest sample (idle: ${mib(r.rssIdle)}) | ${mib(r.alone.relayRssMax)} | ${mib(r.attacked.relayRssMax)} | ${ratio(r.attacked.relayRssMax, r.alone.relayRssMax)} |`,
    '',
    'attacks:',
    ...Object.entries(r.attacks).map(([what, n]) => `  ${what}: ${n}`),
  ]
  return lines.join('\n')
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      seconds: { type: 'string', default: '60' },
      pairs: { type: 'string', default: '10' },
      rate: { type: 'string', default: '200' },
      attacks: { type: 'string', default: ATTACKS.join(',') },
      json: { type: 'boolean', default: false },
    },
  })
  const attacks = values.attacks.split(',')
  const unknown = attacks.filter((a) => !ATTACKS.includes(a))
  if (unknown.length > 0) throw new Error(`unknown attacks ${unknown.join(', ')}; known: ${ATTACKS.join(', ')}`)
  const result = await soak({ seconds: Number(values.seconds), pairs: Number(values.pairs), rate: Number(values.rate), attacks })
  console.log(values.json ? JSON.stringify(result, null, 2) : report(result))
}
