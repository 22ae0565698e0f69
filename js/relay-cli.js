#!/usr/bin/env node
'use strict'
// `npx courier-relay`: runs a relay from the installed package, over the same native code as
// `Relay.start` (or, as `npx courier-relay gateway`, the gateway daemon of `Gateway.start`). It
// reads the same options, environment variables and config file as the `courier-relay` binary
// (docs/operating-the-relay.md), logs to stderr, and stops cleanly on SIGINT / SIGTERM.

const native = require('./binding.js')

async function main(argv) {
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
