#!/usr/bin/env node
'use strict'
// `npx courier-relay`: runs a relay from the installed package, over the same native code as
// `Relay.start` (or, as `npx courier-relay gateway`, the gateway daemon of `Gateway.start`).
// Stops cleanly on SIGINT / SIGTERM.

const native = require('./binding.js')

async function main(args) {
  // `courier-relay gateway …` runs the gateway daemon instead of the relay.
  const gateway = args[0] === 'gateway'
  const name = gateway ? 'courier-relay gateway' : 'courier-relay'
  if (gateway) args = args.slice(1)
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(gateway ? native.gatewayCliHelp() : native.relayCliHelp())
    return
  }
  let server
  try {
    server = gateway ? await native.NativeGateway.startFromArgs(args) : await native.NativeRelay.startFromArgs(args)
  } catch (e) {
    process.stderr.write(`${name}: ${e.message}\n`)
    process.stderr.write(`Run ${name} --help for the options.\n`)
    process.exitCode = 2
    return
  }
  process.stdout.write(`${name} listening on ${gateway ? server.address : server.url}\n`)
  // The server runs on native threads, which do not hold Node's event loop open by themselves.
  const keepAlive = setInterval(() => {}, 1 << 30)
  const stop = async () => {
    clearInterval(keepAlive)
    await server.stop()
    process.exit(0)
  }
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
}

main(process.argv.slice(2))
