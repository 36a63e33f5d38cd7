// Bundle the viewer's browser code into ONE file of the Python package (committed):
//   npm ci --prefix viewer && npm run build --prefix viewer
// or `node viewer/build.mjs OUT` to write elsewhere (tests/test_viewer_bundle.py rebuilds it
// and compares). The options are fixed so that the same lock file gives the same bytes.
import { build } from 'esbuild'
import { fileURLToPath } from 'node:url'
import { dirname, resolve } from 'node:path'

const here = dirname(fileURLToPath(import.meta.url))
const out = resolve(process.argv[2] ?? resolve(here, '../sync/viewer_static/viewer.js'))

await build({
  absWorkingDir: here,
  entryPoints: ['src/main.js'],
  bundle: true,
  format: 'iife',
  platform: 'browser',
  target: 'es2020',
  minify: true,
  charset: 'utf8',
  legalComments: 'eof',
  sourcemap: false,
  banner: { js: '/* crdtstore record viewer: built by `npm run build --prefix viewer` from viewer/src (do not edit) */' },
  outfile: out,
  logLevel: 'warning'
})
