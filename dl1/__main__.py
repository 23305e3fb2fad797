from dl1.cli import main

main()
