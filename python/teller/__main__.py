from teller.cli import main

main()
