// `npx courier-relay`: the package's bin, run as its own process.
import assert from 'node:assert/strict'
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { Protocol, issueToken } from '../js/index.js'
import { PLAINTEXT, record, tempDir, until, waitFor } from './helpers.mjs'

const BIN = fileURLToPath(new URL('../js/relay-cli.js', import.meta.url))
const NATIVE = fileURLToPath(new URL('../native.js', import.meta.url))

/** This process's environment without the relay's own variables, plus `extra`. */
function environment(extra = {}) {
  const inherited = Object.entries(process.env).filter(([key]) => !key.startsWith('COURIER_RELAY_') && key !== 'RUST_LOG')
  return { ...Object.fromEntries(inherited), ...extra }
}

/** The lines a stream has written so far (the array grows as more come). */
function lines(stream) {
  const seen = []
  createInterface({ input: stream }).on('line', (line) => seen.push(line))
  return seen
}

test('--help documents every flag', () => {
  const help = execFileSync(process.execPath, [BIN, '--help'], { encoding: 'utf8' })
  // The options section: one line per flag, each starting with it.
  const documented = help
    .split('\n')
    .map((line) => line.trimStart())
    .filter((line) => line.startsWith('--'))
    .map((line) => line.split(/\s/)[0])
  const flags = ['--config', '--listen', '--db', '--memory', '--cluster', '--cluster-name', '--cluster-replicas', '--cluster-presence-ttl-ms', '--jwt-secret-file', '--jwt-secret-encoding', '--max-token-lifetime-sec', '--token-audience', '--token-issuer', '--revoked-tokens', '--auth-attempts-per-source', '--auth-attempts-per-account', '--displacements-per-account', '--max-unauthenticated-per-source', '--limit-loopback', '--no-mailbox', '--no-key-directory', '--presence-visibility', '--mailbox-max-messages', '--mailbox-max-bytes', '--mailbox-ttl-ms', '--mailbox-sender-share-percent', '--journal-max-bytes', '--address-max-per-account', '--address-ttl-ms', '--rate-burst', '--rate-per-sec', '--max-connections', '--tls-cert', '--tls-key', '--metrics-listen', '--log-level', '--log-format']
  assert.deepEqual(documented.sort(), flags.sort())
  // Each with its environment variable, and the two that only print.
  for (const flag of flags) assert.match(help, new RegExp(`\\[env: COURIER_RELAY_${flag.slice(2).replaceAll('-', '_').toUpperCase()}\\]`))
  assert.match(help, /-h, --help/)
  assert.match(help, /-V, --version/)
  assert.match(execFileSync(process.execPath, [BIN, '--version'], { encoding: 'utf8' }), /^courier-relay \d+\.\d+\.\d+\S*\n$/)
})

test('bad arguments exit with status 2 and say why', () => {
  assert.throws(
    () => execFileSync(process.execPath, [BIN, '--listen', 'nowhere'], { encoding: 'utf8', stdio: 'pipe' }),
    (e) => e.status === 2 && /^courier-relay: /.test(e.stderr) && !/ERR_/.test(e.stderr),
  )
})

test('the relay command serves clients and stops on SIGTERM', async (t) => {
  const dir = tempDir(t)
  const secretFile = join(dir, 'secret.txt')
  writeFileSync(secretFile, 'cli-secret-0123456789abcdef-012345\n')
  const child = spawn(process.execPath, [BIN, '--listen', '127.0.0.1:0', '--db', join(dir, 'relay.db'), '--jwt-secret-file', secretFile], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })))
  t.after(() => child.kill('SIGKILL'))
  const line = await new Promise((resolve) => createInterface({ input: child.stdout }).once('line', resolve))
  const url = /listening on (ws:\/\/\S+)/.exec(line)?.[1]
  assert.ok(url, `unexpected first line: ${line}`)

  const peer = async (name) => {
    const p = new Protocol({
      appId: 'cli',
      storage: { path: join(dir, `${name}.db`) },
      transports: { internet: { url, authToken: issueToken('cli-secret-0123456789abcdef-012345', name) } },
      encryption: PLAINTEXT,
    })
    const recorder = record(p)
    await p.start()
    await waitFor(recorder, (e) => e.type === 'internet_status_changed' && e.connected)
    return { p, recorder }
  }
  const bob = await peer('bob')
  const alice = await peer('alice')
  const id = await alice.p.sendMessage('bob', 'via the command line relay')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  await alice.p.stop()
  await bob.p.stop()

  child.kill('SIGTERM')
  assert.deepEqual(await exited, { code: 0, signal: null })
})

test('the relay command reads its environment, logs JSON to stderr and serves probes', async (t) => {
  const dir = tempDir(t)
  const secretFile = join(dir, 'secret.txt')
  writeFileSync(secretFile, 'cli-secret-0123456789abcdef-012345\n')
  const child = spawn(process.execPath, [BIN, '--memory', '--log-format', 'json'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: environment({
      COURIER_RELAY_LISTEN: '127.0.0.1:0',
      COURIER_RELAY_JWT_SECRET_FILE: secretFile,
      COURIER_RELAY_METRICS_LISTEN: '127.0.0.1:0',
    }),
  })
  // 'close' comes once stdout and stderr have ended too.
  const closed = new Promise((resolve) => child.once('close', (code, signal) => resolve({ code, signal })))
  t.after(() => child.kill('SIGKILL'))
  const stdout = lines(child.stdout)
  const stderr = lines(child.stderr)
  await until(() => stdout.length >= 2, { what: 'the listening lines' })
  assert.match(stdout[0], /^courier-relay listening on ws:\/\/127\.0\.0\.1:\d+$/)
  const metrics = /^courier-relay metrics listening on http:\/\/(127\.0\.0\.1:\d+)$/.exec(stdout[1])?.[1]
  assert.ok(metrics, `unexpected second line: ${stdout[1]}`)

  const health = await fetch(`http://${metrics}/healthz`)
  assert.deepEqual([health.status, await health.text()], [200, 'ok\n'])
  const scrape = await fetch(`http://${metrics}/metrics`)
  assert.equal(scrape.status, 200)
  assert.match(await scrape.text(), /^courier_relay_connections 0$/m)

  child.kill('SIGTERM')
  assert.deepEqual(await closed, { code: 0, signal: null })
  const events = stderr.map((line) => JSON.parse(line))
  for (const event of events) assert.match(event.level, /^(ERROR|WARN|INFO|DEBUG|TRACE)$/)
  assert.ok(events.some((e) => e.message === 'relay listening' && e.metrics === metrics), JSON.stringify(events))
  assert.ok(events.some((e) => e.message === 'relay stopped'), JSON.stringify(events))
})

test('a program that only loads the package gets no logs from a relay it starts', (t) => {
  // Only the command installs a log subscriber, whatever RUST_LOG says.
  const dir = tempDir(t)
  const secretFile = join(dir, 'secret.txt')
  writeFileSync(secretFile, 'cli-secret-0123456789abcdef-012345\n')
  const args = ['--listen', '127.0.0.1:0', '--memory', '--jwt-secret-file', secretFile, '--log-level', 'debug']
  const script = `require(${JSON.stringify(NATIVE)}).NativeRelay.startFromArgs(${JSON.stringify(args)}).then((relay) => relay.stop())`
  const run = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', env: environment({ RUST_LOG: 'trace' }), timeout: 30_000 })
  assert.equal(run.status, 0, run.stderr)
  assert.equal(run.stderr, '')
})
