#!/usr/bin/env node
'use strict'
// `npx courier-relay`: runs a relay from the installed package, over the same native code as
// `Relay.start` (or, as `npx courier-relay gateway`, the gateway daemon of `Gateway.start`). It
// reads the same options, environment variables and config file as the `courier-relay` binary
// (docs/operating-the-relay.md), logs to stderr, and stops cleanly on SIGINT / SIGTERM.
// `npx courier-relay inspect <client.db>` draws a client database's message ledgers instead.

const { writeFileSync } = require('node:fs')
const { resolve } = require('node:path')

const native = require('./binding.js')

const INSPECT_USAGE = `Usage: courier-relay inspect <client.db> [--out <file.html>] [--limit <n>] [--label <peer>=<name>]...

Draws the message ledgers of an offline-courier client database (docs/delivery.md#a-messages-life)
as one self-contained HTML page: a timeline with a lane per peer. Reads the file without locking
it, so a running client may hold it. Default --out: <client.db>.html; default --limit: 200.
--label names a peer (an off1 address, say) on its lane.
`

/** `inspect <client.db> [--out file] [--limit n]`: writes the page, prints its path. */
function inspect(args) {
  const options = { out: null, limit: 200, labels: {} }
  const positional = []
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]
    if (arg === '--help' || arg === '-h') {
      process.stdout.write(INSPECT_USAGE)
      return 0
    } else if (arg === '--out' || arg === '--limit' || arg === '--label') {
      const value = args[++i]
      if (value === undefined) return usageError(`${arg} needs a value`)
      const label = arg === '--label' && /^([^=]+)=(.+)$/.exec(value)
      if (arg === '--out') options.out = value
      else if (label) options.labels[label[1]] = label[2]
      else if (arg === '--label') return usageError(`--label takes <peer>=<name>, not ${value}`)
      else if (/^[1-9]\d*$/.test(value)) options.limit = Number(value)
      else return usageError(`--limit must be a positive integer, not ${value}`)
    } else if (arg.startsWith('-')) {
      return usageError(`unknown option ${arg}`)
    } else {
      positional.push(arg)
    }
  }
  if (positional.length !== 1) return usageError('one client database path is needed')
  const db = resolve(positional[0])
  const out = resolve(options.out ?? `${db}.html`)
  let timelines
  try {
    timelines = JSON.parse(native.readMessageLedgers(db, options.limit))
  } catch (e) {
    process.stderr.write(`courier-relay inspect: ${e.message}\n`)
    return 1
  }
  const { render } = require('./inspect.js')
  writeFileSync(out, render(timelines, { title: `offline-courier: ${positional[0]}`, labels: options.labels }))
  process.stdout.write(`${out}\n`)
  return 0
}

function usageError(message) {
  process.stderr.write(`courier-relay inspect: ${message}\n${INSPECT_USAGE}`)
  return 2
}

async function main(argv) {
  if (argv[0] === 'inspect') {
    process.exitCode = inspect(argv.slice(1))
    return
  }
  // `courier-relay gateway …` runs the gateway daemon instead of the relay.
  const gateway = argv[0] === 'gateway'
  const name = gateway ? 'courier-relay gateway' : 'courier-relay'
  const args = gateway ? argv.slice(1) : argv
  let server
  try {
    // Reads the whole command line once: the text of --help / --version, or else (null) the log
    // subscriber its options choose is installed. Only this script does that, never a program
    // that merely loads the package.
    const text = native.relayCliInit(argv)
    if (text != null) {
      process.stdout.write(text)
      return
    }
    server = gateway ? await native.NativeGateway.startFromArgs(args) : await native.NativeRelay.startFromArgs(args)
  } catch (e) {
    process.stderr.write(`${name}: ${e.message}\n`)
    if (e.code === 'ERR_CONFIG') {
      process.stderr.write(`Run ${name} --help for the options.\n`)
      process.exitCode = 2
    } else {
      process.exitCode = 1
    }
    return
  }
  // The server runs on native threads, which do not hold Node's event loop open by themselves.
  const keepAlive = setInterval(() => {}, 1 << 30)
  const stop = async () => {
    clearInterval(keepAlive)
    try {
      await server.stop()
    } catch (e) {
      process.stderr.write(`${name}: stopping failed: ${e.message}\n`)
      process.exit(1)
    }
    process.exit(0)
  }
  // Caught before the first line: a supervisor may signal as soon as it reads it.
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
  // Scripts and tests wait for the first line.
  const lines = [`${name} listening on ${gateway ? server.address : server.url}`]
  if (!gateway && server.metricsAddress) lines.push(`${name} metrics listening on http://${server.metricsAddress}`)
  process.stdout.write(`${lines.join('\n')}\n`)
}

main(process.argv.slice(2))
