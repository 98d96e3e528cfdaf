from tracewhy.console import console_main

console_main()
