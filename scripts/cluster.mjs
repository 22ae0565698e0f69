// `npm run cluster`: a relay cluster on this machine for development (docs/cluster.md): three NATS
// servers with JetStream, routed to each other, and relay nodes over them (`courier-relay
// --cluster`, three by default), all on 127.0.0.1 ports the system picks. Prints each relay
// node's URL, the NATS URLs and the token secret's file, then a last line `ready <json>` for
// scripts; stops everything on Ctrl-C (SIGINT) or SIGTERM and removes what it wrote.
//
//   npm run cluster [-- --nodes N] [--dir PATH]
//
// Clients list the relay nodes in `transports.internet.url` and fail over between them.
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

import { configureServers, natsBinary } from './nats-servers.mjs'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const DEADLINE_MS = 60_000

const args = process.argv.slice(2)
const option = (name, fallback) => {
  const i = args.indexOf(name)
  return i === -1 ? fallback : args[i + 1]
}
const nodes = Number(option('--nodes', '3'))
if (!Number.isInteger(nodes) || nodes < 1 || nodes > 16) {
  console.error('cluster: --nodes takes 1 to 16')
  process.exit(2)
}
const ownDir = option('--dir', null) === null
const dir = ownDir ? mkdtempSync(join(tmpdir(), 'courier-cluster-')) : option('--dir')
mkdirSync(dir, { recursive: true })

const children = []
let stopping = false

async function stop(code) {
  if (stopping) return
  stopping = true
  // Relay nodes first, so their connections end before the servers they write to.
  for (const child of [...children].reverse()) child.kill('SIGTERM')
  await Promise.all(children.map((c) => (c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null)))
  if (ownDir) rmSync(dir, { recursive: true, force: true })
  process.exit(code)
}
process.on('SIGINT', () => stop(0))
process.on('SIGTERM', () => stop(0))

function fail(message) {
  console.error(`cluster: ${message}`)
  stop(1)
}

async function healthy(monitor) {
  try {
    const response = await fetch(`http://127.0.0.1:${monitor}/healthz`)
    return response.status === 200
  } catch {
    return false
  }
}

async function startNats() {
  const binary = natsBinary()
  const servers = await configureServers(dir, 'courier-dev')
  servers.forEach((server, i) => {
    // Their logs go to files beside their stores: the relay nodes' logs are the ones to watch.
    const log = openSync(join(dir, `n${i}.log`), 'a')
    const child = spawn(binary, ['-c', server.config], { stdio: ['ignore', 'ignore', log] })
    closeSync(log)
    child.once('exit', (code, signal) => stopping || fail(`NATS server ${server.name} exited (${code ?? signal})`))
    children.push(child)
  })
  const deadline = Date.now() + DEADLINE_MS
  while (!(await Promise.all(servers.map((s) => healthy(s.monitor)))).every(Boolean)) {
    if (Date.now() > deadline) fail('the NATS servers were not healthy within 60 s')
    await new Promise((r) => setTimeout(r, 100))
  }
  return servers.map((s) => s.url)
}

function startNode(i, nats, secretFile) {
  const child = spawn(
    process.execPath,
    [join(ROOT, 'js', 'relay-cli.js'), '--cluster', nats.join(','), '--listen', '127.0.0.1:0', '--jwt-secret-file', secretFile],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  )
  children.push(child)
  child.once('exit', (code, signal) => stopping || fail(`relay node ${i} exited (${code ?? signal})`))
  return new Promise((resolve) => {
    const timer = setTimeout(() => fail(`relay node ${i} did not start within 60 s`), DEADLINE_MS)
    createInterface({ input: child.stdout }).on('line', (line) => {
      const url = /listening on (\S+)/.exec(line)?.[1]
      if (url) {
        clearTimeout(timer)
        resolve(url)
      }
    })
  })
}

const nats = await startNats()
const secretFile = join(dir, 'jwt-secret.txt')
writeFileSync(secretFile, randomBytes(32).toString('hex'))
const relays = []
for (let i = 0; i < nodes; i++) relays.push(await startNode(i, nats, secretFile))
relays.forEach((url, i) => console.log(`relay node ${i}: ${url}`))
console.log(`NATS servers: ${nats.join(' ')}`)
console.log(`token secret: ${secretFile} (issueToken(secret, account) signs client tokens)`)
console.log('Ctrl-C stops the cluster.')
console.log(`ready ${JSON.stringify({ relays, nats, secretFile, dir })}`)
