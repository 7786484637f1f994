from mxconvert._entry import main

main()
