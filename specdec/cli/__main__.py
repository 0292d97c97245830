from specdec.cli.main import main

main()
