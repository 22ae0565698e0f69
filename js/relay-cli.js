#!/usr/bin/env node
'use strict'
// `npx courier-relay`: runs a relay from the installed package, over the same native code as
// `Relay.start`. Stops cleanly on SIGINT / SIGTERM.

const native = require('../index.js')

async function main(args) {
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(native.relayCliHelp())
    return
  }
  let relay
  try {
    relay = await native.NativeRelay.startFromArgs(args)
  } catch (e) {
    process.stderr.write(`courier-relay: ${String(e.message).replace(/^\[ERR_[A-Z_]+\] /, '')}\n`)
    process.stderr.write('Run courier-relay --help for the options.\n')
    process.exitCode = 2
    return
  }
  process.stdout.write(`courier-relay listening on ${relay.url}\n`)
  // The relay runs on native threads, which do not hold Node's event loop open by themselves.
  const keepAlive = setInterval(() => {}, 1 << 30)
  const stop = async () => {
    clearInterval(keepAlive)
    await relay.stop()
    process.exit(0)
  }
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
}

main(process.argv.slice(2))
