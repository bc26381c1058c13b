// ESLint for the project's JavaScript (make lint runs it from the repo
// root with --config tools/eslint/eslint.config.js). The recommended rules:
// real mistakes (undefined names, unused variables, unreachable code,
// constant conditions), not style.
import js from '@eslint/js';
import globals from 'globals';

export default [
  { ignores: ['**/node_modules/**', '**/target/**', '**/.venv/**', 'dist/**'] },
  js.configs.recommended,
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: {
      ecmaVersion: 2024,
      sourceType: 'module',
      globals: { ...globals.node },
    },
    rules: {
      // An argument or caught error named _ on purpose is not a mistake.
      'no-unused-vars': ['error', { argsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
];
