// Builds the Node-API addon from source with the machine's Rust toolchain (run by `npm ci`
// through the `prepare` script). `--debug` skips optimisation for a faster edit-build loop.
// napi-rs generates the loader `native.js` and its typings `native.d.ts`; the package's entry
// point is the facade in `js/`.
import { spawnSync } from 'node:child_process'

const debug = process.argv.includes('--debug')
const args = ['napi', 'build', '--platform', '--js', 'native.js', '--dts', 'native.d.ts']
if (!debug) args.push('--release')

const result = spawnSync('npx', args, { stdio: 'inherit', shell: process.platform === 'win32' })
if (result.error) throw result.error
process.exit(result.status ?? 1)
